// SwiGLU on the GPU over the [gate | up] rows of one GEMM: out = silu(gate) * up, silu(g) =
// g / (1 + exp(-g)) in fp32 (torch's formula, as cpu::silu).
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

// V consecutive elements per thread (16-byte loads and stores when the rows allow, else 1).
template <typename T, int V>
__global__ void swiglu_kernel(T* out, const T* gate_up, int64_t n_rows, int64_t inter) {
  static_assert(V >= 1, "width");
  const int64_t groups = inter / V, n = n_rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups, c = (i - r * groups) * V;
    alignas(16) T g[V], u[V], o[V];
    if constexpr (V > 1) {
      *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + c);
      *reinterpret_cast<uint4*>(u) = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + inter + c);
    } else {
      g[0] = gate_up[r * 2 * inter + c];
      u[0] = gate_up[r * 2 * inter + inter + c];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gf = to_f32(g[j]);
      o[j] = from_f32<T>(gf / (1.0f + expf(-gf)) * to_f32(u[j]));
    }
    if constexpr (V > 1)
      *reinterpret_cast<uint4*>(out + r * inter + c) = *reinterpret_cast<const uint4*>(o);
    else
      out[r * inter + c] = o[0];
  }
}

// Interleaved rows [g_0, u_0, g_1, u_1, ...]: V outputs from 2V consecutive inputs per thread.
template <typename T, int V>
__global__ void swiglu_pairs_kernel(T* out, const T* gate_up, int64_t n_rows, int64_t inter) {
  const int64_t groups = inter / V, n = n_rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups, c = (i - r * groups) * V;
    const T* src = gate_up + r * 2 * inter + 2 * c;
    alignas(16) T o[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float g = to_f32(src[2 * j]), u = to_f32(src[2 * j + 1]);
      o[j] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) out[r * inter + c + j] = o[j];
  }
}

}  // namespace

template <typename T>
void swiglu_pairs(T* out, const T* gate_up, int64_t n_rows, int64_t inter, cudaStream_t stream) {
  const int64_t n = n_rows * inter;
  if (n == 0) return;
  if (inter % 4 == 0)
    swiglu_pairs_kernel<T, 4><<<grid_for(n / 4, 256 * 4), 256, 0, stream>>>(out, gate_up, n_rows, inter);
  else
    swiglu_pairs_kernel<T, 1><<<grid_for(n, 256 * 4), 256, 0, stream>>>(out, gate_up, n_rows, inter);
  CUDA_CHECK_LAUNCH("swiglu_pairs_kernel");
}

template <typename T>
void swiglu(T* out, const T* gate_up, int64_t n_rows, int64_t inter, cudaStream_t stream) {
  const int64_t n = n_rows * inter;
  if (n == 0) return;
  constexpr int V = 16 / sizeof(T);
  const bool vec = inter % V == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(gate_up) % 16 == 0;
  if (vec)
    swiglu_kernel<T, V><<<grid_for(n / V, 256 * 4), 256, 0, stream>>>(out, gate_up, n_rows, inter);
  else
    swiglu_kernel<T, 1><<<grid_for(n, 256 * 4), 256, 0, stream>>>(out, gate_up, n_rows, inter);
  CUDA_CHECK_LAUNCH("swiglu_kernel");
}

#define INST(T)                                                               \
  template void swiglu<T>(T*, const T*, int64_t, int64_t, cudaStream_t); \
  template void swiglu_pairs<T>(T*, const T*, int64_t, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
