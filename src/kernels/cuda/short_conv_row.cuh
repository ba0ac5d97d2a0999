// The prompt rows of the short-conv mixer (cpu::short_conv) a thread computes, V consecutive
// channels: C * sum_j w[c, j] * (B * x)[t - (L-1) + j, c], taps in order j = 0..L-1, rounded to T,
// one row (any L) or a window of rows (3 taps). Shared by short_conv's kernels (short_conv.cu) and
// the kernel that quantizes its output (short_conv_fp8.cu), so both give a row the same T values.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace lfm2::cuda {

// o = the outputs of channels [c0, c0 + V) of row `row` (position t = row % seq_len); bcx rows
// (B, C, x) of 3 * hidden; 16-byte loads when V * sizeof(T) == 16 (then c0 and the rows aligned).
template <typename T, int V>
__device__ __forceinline__ void short_conv_outputs(T (&o)[V], const T* bcx, const float* conv_w, int64_t row,
                                                   int64_t seq_len, int64_t c0, int64_t hidden, int64_t L) {
  const int64_t t = row % seq_len;
  float z[V] = {};
  for (int64_t j = 0; j < L; ++j) {
    const int64_t tt = t - (L - 1) + j;
    if (tt < 0) continue;
    const T* src = bcx + (row - t + tt) * 3 * hidden;
    alignas(16) T b[V], x[V];
    if constexpr (V * sizeof(T) == 16) {
      *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(src + c0);
      *reinterpret_cast<uint4*>(x) = *reinterpret_cast<const uint4*>(src + 2 * hidden + c0);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) b[v] = src[c0 + v], x[v] = src[2 * hidden + c0 + v];
    }
#pragma unroll
    for (int v = 0; v < V; ++v) z[v] += conv_w[(c0 + v) * L + j] * (to_f32(b[v]) * to_f32(x[v]));
  }
  alignas(16) T cg[V];
  const T* crow = bcx + row * 3 * hidden + hidden + c0;
  if constexpr (V * sizeof(T) == 16)
    *reinterpret_cast<uint4*>(cg) = *reinterpret_cast<const uint4*>(crow);
  else
#pragma unroll
    for (int v = 0; v < V; ++v) cg[v] = crow[v];
#pragma unroll
  for (int v = 0; v < V; ++v) o[v] = from_f32<T>(to_f32(cg[v]) * z[v]);
}

constexpr int kConvWindowRows = 4;  // rows a thread of the windowed kernels (LFM2's 3 taps)

// Rows row0 .. row0 + n_r - 1 of one sequence (positions t0 .. t0 + n_r - 1, n_r <= R) with KL
// taps: each row's (B * x) products loaded and formed once for the R rows instead of once per tap,
// then each row's sum in short_conv_outputs' order (the same bits). Every load is issued before any
// use, a tap before the sequence or a row past n_r reading row0 instead (its values unused): one
// round trip to memory a thread, where loads behind their conditions waited one by one.
template <typename T, int V, int R, int KL>
__device__ __forceinline__ void short_conv_window(T (&o)[R][V], const T* bcx, const float* conv_w, int64_t row0,
                                                  int64_t t0, int n_r, int64_t c0, int64_t hidden) {
  static_assert(V * sizeof(T) == 16, "16-byte loads");
  constexpr int K = R + KL - 1;  // the rows whose (B * x) the R rows' taps read
  alignas(16) T b[K][V], x[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const bool used = t0 - (KL - 1) + k >= 0 && k < n_r + KL - 1;
    const T* src = bcx + (used ? row0 - (KL - 1) + k : row0) * 3 * hidden + c0;
    *reinterpret_cast<uint4*>(b[k]) = *reinterpret_cast<const uint4*>(src);
    *reinterpret_cast<uint4*>(x[k]) = *reinterpret_cast<const uint4*>(src + 2 * hidden);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)  // C of each row, into o until its sum
    *reinterpret_cast<uint4*>(o[r]) =
        *reinterpret_cast<const uint4*>(bcx + (row0 + (r < n_r ? r : 0)) * 3 * hidden + hidden + c0);
  float w[V][KL];
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int j = 0; j < KL; ++j) w[v][j] = conv_w[(c0 + v) * KL + j];
  float u[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) u[k][v] = to_f32(b[k][v]) * to_f32(x[k][v]);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= n_r) break;
    float z[V] = {};
#pragma unroll
    for (int j = 0; j < KL; ++j) {
      if (t0 + r - (KL - 1) + j < 0) continue;
#pragma unroll
      for (int v = 0; v < V; ++v) z[v] += w[v][j] * u[r + j][v];
    }
#pragma unroll
    for (int v = 0; v < V; ++v) o[r][v] = from_f32<T>(to_f32(o[r][v]) * z[v]);
  }
}

}  // namespace lfm2::cuda
