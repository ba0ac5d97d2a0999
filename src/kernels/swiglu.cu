// SwiGLU on the GPU over the [gate | up] rows of one GEMM: out = silu(gate) * up, silu(g) =
// g / (1 + exp(-g)) in fp32 (torch's formula, as cpu::silu).
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

template <typename T>
__global__ void swiglu_kernel(T* out, const T* gate_up, int64_t n_rows, int64_t inter) {
  const int64_t n = n_rows * inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i - r * inter;
    const float g = to_f32(gate_up[r * 2 * inter + c]), u = to_f32(gate_up[r * 2 * inter + inter + c]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * u);
  }
}

}  // namespace

template <typename T>
void swiglu(T* out, const T* gate_up, int64_t n_rows, int64_t inter, cudaStream_t stream) {
  const int64_t n = n_rows * inter;
  if (n == 0) return;
  swiglu_kernel<<<grid_for(n, 256 * 4), 256, 0, stream>>>(out, gate_up, n_rows, inter);
  CUDA_CHECK_LAUNCH("swiglu_kernel");
}

#define INST(T) template void swiglu<T>(T*, const T*, int64_t, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
