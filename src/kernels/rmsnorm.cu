// RMSNorm on the GPU, with the residual add fused in (add_rmsnorm), a last-token variant for the
// head, and one that also quantizes its output to e4m3 (rmsnorm_quantize_e4m3: an FP8 product's
// input). One block per row; sum of squares in fp32 with a fixed reduction order.
#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/row_norm.cuh"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = row_norm::kThreads;

// kAdd: x += delta first (x written back). Row r of `in` is r * in_step + in_offset, or with
// lengths r * in_step + lengths[r] - 1 (each sequence's own last position).
template <typename T, bool kAdd>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(T* out, float* x, const T* delta, const float* weight,
                                                           int64_t dim, float eps, int64_t in_step,
                                                           int64_t in_offset, const int32_t* lengths) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float* xr = x + (r * in_step + (lengths ? int64_t(lengths[r]) - 1 : in_offset)) * dim;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = xr[i];
    if constexpr (kAdd) {
      v += to_f32(delta[r * dim + i]);
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) out[r * dim + i] = from_f32<T>(weight[i] * (xr[i] * inv));
}

// One pass for rows of at most kThreads * 4 * kMaxVec floats, 16-byte aligned: each thread keeps
// its float4 chunks in registers between the sum and the scaling (no second read of x; row_norm.cuh),
// kVec of them (row_norm::short_row: 2).
using row_norm::kMaxVec;

template <typename T, bool kAdd, int kVec>
__global__ void __launch_bounds__(kThreads) rmsnorm_vec_kernel(T* out, float* x, const T* delta, const float* weight,
                                                               int64_t dim, float eps, int64_t in_step,
                                                               int64_t in_offset, const int32_t* lengths) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float4* xr = reinterpret_cast<float4*>(x + (r * in_step + (lengths ? int64_t(lengths[r]) - 1 : in_offset)) * dim);
  const int chunks = int(dim / 4);
  float4 v[kVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      v[j] = xr[c];
      if constexpr (kAdd) {
        const T* d = delta + r * dim + 4 * int64_t(c);
        v[j].x += to_f32(d[0]), v[j].y += to_f32(d[1]), v[j].z += to_f32(d[2]), v[j].w += to_f32(d[3]);
        xr[c] = v[j];
      }
      ss = row_norm::add_squares(ss, v[j]);
    }
  }
  const float inv = row_norm::inv_rms(ss, scratch, dim, eps);
  row_norm::write_row<T, kVec>(row_norm::RowOut<T>{out + r * dim, nullptr, nullptr, 0, false}, v, chunks, weight, inv,
                               scratch);
}

// rmsnorm_vec_kernel's norm, then the T outputs (widened back) quantized from registers (row_norm's
// write_row); rows before first_q (decode rows) are not quantized, and with prompt_out false the
// rows from first_q on write no T output.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_e4m3_kernel(T* out, uint8_t* q, float* scales, const float* x, const float* weight, int64_t dim,
                        float eps, int64_t first_q, int64_t q_rows, bool per_row, bool prompt_out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + r * dim);
  const int chunks = int(dim / 4);
  float4 v[kVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (c < chunks) {
      v[j] = xr[c];
      ss = row_norm::add_squares(ss, v[j]);
    }
  }
  const float inv = row_norm::inv_rms(ss, scratch, dim, eps);
  const bool quantized = r >= first_q;  // block-uniform
  const row_norm::RowOut<T> o{prompt_out || !quantized ? out + r * dim : nullptr,
                              quantized ? reinterpret_cast<uint32_t*>(q + (r - first_q) * dim) : nullptr,
                              quantized ? scales + (r - first_q) : nullptr, q_rows, per_row};
  row_norm::write_row<T, kVec>(o, v, chunks, weight, inv, scratch);
}

template <typename T, bool kAdd>
void launch(T* out, float* x, const T* delta, const float* weight, int64_t n_rows, int64_t dim, float eps,
            int64_t in_step, int64_t in_offset, const int32_t* lengths, cudaStream_t stream) {
  const bool vec = dim % 4 == 0 && dim <= int64_t(kThreads) * 4 * kMaxVec &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) == 0;
  if (vec && row_norm::short_row(dim))
    rmsnorm_vec_kernel<T, kAdd, 2><<<unsigned(n_rows), kThreads, 0, stream>>>(out, x, delta, weight, dim, eps,
                                                                              in_step, in_offset, lengths);
  else if (vec)
    rmsnorm_vec_kernel<T, kAdd, kMaxVec><<<unsigned(n_rows), kThreads, 0, stream>>>(out, x, delta, weight, dim, eps,
                                                                                    in_step, in_offset, lengths);
  else
    rmsnorm_kernel<T, kAdd><<<unsigned(n_rows), kThreads, 0, stream>>>(out, x, delta, weight, dim, eps, in_step,
                                                                       in_offset, lengths);
}

}  // namespace

template <typename T>
void rmsnorm(T* out, const float* in, const float* weight, int64_t n_rows, int64_t dim, float eps,
             cudaStream_t stream) {
  if (n_rows == 0) return;
  launch<T, false>(out, const_cast<float*>(in), nullptr, weight, n_rows, dim, eps, 1, 0, nullptr, stream);
  CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

template <typename T>
void add_rmsnorm(T* out, float* x, const T* delta, const float* weight, int64_t n_rows, int64_t dim, float eps,
                 cudaStream_t stream) {
  if (n_rows == 0) return;
  launch<T, true>(out, x, delta, weight, n_rows, dim, eps, 1, 0, nullptr, stream);
  CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

template <typename T>
void rmsnorm_last(T* out, const float* in, const float* weight, int64_t n_seq, int64_t seq_len, int64_t dim,
                  float eps, cudaStream_t stream, const int32_t* lengths) {
  if (n_seq == 0) return;
  launch<T, false>(out, const_cast<float*>(in), nullptr, weight, n_seq, dim, eps, seq_len, seq_len - 1, lengths,
                   stream);
  CUDA_CHECK_LAUNCH("rmsnorm_last_kernel");
}

template <typename T>
void rmsnorm_quantize_e4m3(T* out, uint8_t* q, float* scales, const float* in, const float* weight, int64_t n_rows,
                           int64_t first_q, int64_t dim, float eps, bool per_row, cudaStream_t stream,
                           bool prompt_out) {
  LFM2_CHECK(dim % 128 == 0 && dim <= int64_t(kThreads) * 4 * kMaxVec && first_q >= 0 && first_q <= n_rows,
             "rmsnorm_quantize_e4m3: dim ", dim, " (a multiple of 128, at most ", kThreads * 4 * kMaxVec,
             "), rows quantized from ", first_q, " of ", n_rows);
  LFM2_CHECK(reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(out) % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0,
             "rmsnorm_quantize_e4m3: aligned rows (in and weight 16 bytes, out 8, q 4)");
  if (n_rows == 0) return;
  auto kernel = row_norm::short_row(dim) ? rmsnorm_e4m3_kernel<T, 2> : rmsnorm_e4m3_kernel<T, kMaxVec>;
  kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(out, q, scales, in, weight, dim, eps, first_q, n_rows - first_q,
                                                    per_row, prompt_out);
  CUDA_CHECK_LAUNCH("rmsnorm_e4m3_kernel");
}

template void rmsnorm_quantize_e4m3<__nv_bfloat16>(__nv_bfloat16*, uint8_t*, float*, const float*, const float*,
                                                   int64_t, int64_t, int64_t, float, bool, cudaStream_t, bool);
template void rmsnorm_quantize_e4m3<__half>(__half*, uint8_t*, float*, const float*, const float*, int64_t, int64_t,
                                            int64_t, float, bool, cudaStream_t, bool);

#define INST(T)                                                                                                   \
  template void rmsnorm<T>(T*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);              \
  template void add_rmsnorm<T>(T*, float*, const T*, const float*, int64_t, int64_t, float, cudaStream_t);      \
  template void rmsnorm_last<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, float, cudaStream_t, \
                                const int32_t*);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
