// The short-conv mixer on the GPU: one thread per (token, channel) computes
// C * sum_j w[c, j] * (B * x)[t - (L-1) + j, c], taps in order j = 0..L-1 as on the CPU.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

template <typename T>
__global__ void short_conv_kernel(T* out, const T* bcx, const float* conv_w, int64_t n_rows, int64_t seq_len,
                                  int64_t hidden, int64_t L) {
  const int64_t n = n_rows * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / hidden, c = i - row * hidden;
    const int64_t t = row % seq_len;
    float z = 0.f;
    for (int64_t j = 0; j < L; ++j) {
      const int64_t tt = t - (L - 1) + j;
      if (tt < 0) continue;
      const T* src = bcx + (row - t + tt) * 3 * hidden;
      z += conv_w[c * L + j] * (to_f32(src[c]) * to_f32(src[2 * hidden + c]));
    }
    out[i] = from_f32<T>(to_f32(bcx[row * 3 * hidden + hidden + c]) * z);
  }
}

}  // namespace

template <typename T>
void short_conv(T* out, const T* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden, int64_t L,
                cudaStream_t stream) {
  const int64_t n = n_seq * seq_len * hidden;
  if (n == 0) return;
  short_conv_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, bcx, conv_w, n_seq * seq_len, seq_len, hidden, L);
  CUDA_CHECK_LAUNCH("short_conv_kernel");
}

#define INST(T) \
  template void short_conv<T>(T*, const T*, const float*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
