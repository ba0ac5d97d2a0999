// The short-conv mixer's prompt rows quantized for the e4m3 conv out projection (issue 23): each
// thread's rows and 8 (bf16 / fp16) channels as short_conv's kernel computes them
// (short_conv_row.cuh), then their codes and the scale of each (row, 128 columns) from the
// half-warp that holds the group: the bits quantize_rows_fp8_lt writes for short_conv's rows,
// without the T rows' round trip.
#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/row_norm.cuh"
#include "kernels/cuda/short_conv_row.cuh"

namespace lfm2::cuda {
namespace {

constexpr int kV = 8;  // channels a thread: 16-byte loads; 16 threads = one 128-column group
constexpr int kThreads = 256;

// Each thread kConvWindowRows rows of one sequence (short_conv_window) and 8 channels. Warps step
// over the items 32 at a time, so every lane reaches the shuffles; n % 16 == 0 (hidden % 128 ==
// 0), so a group's half-warp (one chunk of rows, 128 columns) is live or not as a whole. Two blocks
// an SM hold at most 128 registers a thread: past that one block fits and the launch took 1.6x
// as long (twenty-third and twenty-eighth sessions, H200), so the bound keeps the compiler under it.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    short_conv_e4m3_kernel(uint8_t* q, float* scales, const T* bcx, const float* conv_w, int64_t n_seq,
                           int64_t seq_len, int64_t hidden) {
  constexpr int R = kConvWindowRows;
  const int64_t groups = hidden / kV, chunks = (seq_len + R - 1) / R, n = n_seq * chunks * groups;
  const int64_t n_rows = n_seq * seq_len;
  const int lane = int(threadIdx.x & 31);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w * 32 < n; w += warps) {
    const int64_t i = w * 32 + lane;
    const bool live = i < n;
    const int64_t sc = live ? i / groups : 0, c0 = live ? (i - sc * groups) * kV : 0;
    const int64_t s = sc / chunks, t0 = (sc - s * chunks) * R, row0 = s * seq_len + t0;
    const int n_r = live ? (seq_len - t0 < R ? int(seq_len - t0) : R) : 0;  // one value a half-warp
    alignas(16) T o[R][kV];
    if (live) short_conv_window<T, kV, R, 3>(o, bcx, conv_w, row0, t0, n_r, c0, hidden);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float4 v[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
      if (r < n_r) {
        v[0] = make_float4(to_f32(o[r][0]), to_f32(o[r][1]), to_f32(o[r][2]), to_f32(o[r][3]));
        v[1] = make_float4(to_f32(o[r][4]), to_f32(o[r][5]), to_f32(o[r][6]), to_f32(o[r][7]));
      }
      float m = fmaxf(row_norm::abs_max4(v[0]), row_norm::abs_max4(v[1]));
#pragma unroll
      for (int sh = 8; sh > 0; sh >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
      if (r >= n_r) continue;
      const float sc_r = row_norm::scale_of(m);
      *reinterpret_cast<uint2*>(q + (row0 + r) * hidden + c0) =
          make_uint2(row_norm::e4m3x4(v[0], sc_r), row_norm::e4m3x4(v[1], sc_r));
      if ((lane & 15) == 0) scales[(c0 / 128) * n_rows + row0 + r] = sc_r;
    }
  }
}

}  // namespace

template <typename T>
void short_conv_quantize_e4m3(uint8_t* q, float* scales, const T* bcx, const float* conv_w, int64_t n_seq,
                              int64_t seq_len, int64_t hidden, int64_t L, cudaStream_t stream) {
  LFM2_CHECK(hidden % 128 == 0, "short_conv_quantize_e4m3: hidden ", hidden, " is not a multiple of 128");
  LFM2_CHECK(L == 3, "short_conv_quantize_e4m3: ", L, " taps (3 only: LFM2's)");
  LFM2_CHECK(reinterpret_cast<uintptr_t>(bcx) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0,
             "short_conv_quantize_e4m3: rows not 16-byte aligned");
  const int64_t n = n_seq * ((seq_len + kConvWindowRows - 1) / kConvWindowRows) * (hidden / kV);
  if (n == 0) return;
  short_conv_e4m3_kernel<T>
      <<<grid_for(n, kThreads), kThreads, 0, stream>>>(q, scales, bcx, conv_w, n_seq, seq_len, hidden);
  CUDA_CHECK_LAUNCH("short_conv_e4m3_kernel");
}

template void short_conv_quantize_e4m3<__nv_bfloat16>(uint8_t*, float*, const __nv_bfloat16*, const float*, int64_t,
                                                      int64_t, int64_t, int64_t, cudaStream_t);
template void short_conv_quantize_e4m3<__half>(uint8_t*, float*, const __half*, const float*, int64_t, int64_t,
                                               int64_t, int64_t, cudaStream_t);

}  // namespace lfm2::cuda
