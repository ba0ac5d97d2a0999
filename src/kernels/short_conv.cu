// The short-conv mixer on the GPU: one thread per (4 tokens at 3 taps, else one token; 8 or 4
// channels: 16-byte loads) computes C * sum_j w[c, j] * (B * x)[t - (L-1) + j, c], taps in order
// j = 0..L-1 as on the CPU (short_conv_row.cuh). Then generation's (cpu::short_conv_step): a step's
// rows, each continuing from its slot's state.
#include <algorithm>

#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/paged_seq.cuh"
#include "kernels/cuda/short_conv_row.cuh"

namespace lfm2::cuda {
namespace {

// V consecutive channels of one token per thread (16-byte loads and stores where the rows allow).
template <typename T, int V>
__global__ void short_conv_kernel(T* out, const T* bcx, const float* conv_w, int64_t n_rows, int64_t seq_len,
                                  int64_t hidden, int64_t L) {
  const int64_t groups = hidden / V, n = n_rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups, c0 = (i - row * groups) * V;
    alignas(16) T o[V];
    short_conv_outputs<T, V>(o, bcx, conv_w, row, seq_len, c0, hidden, L);
    if constexpr (V * sizeof(T) == 16)
      *reinterpret_cast<uint4*>(out + row * hidden + c0) = *reinterpret_cast<const uint4*>(o);
    else
#pragma unroll
      for (int v = 0; v < V; ++v) out[row * hidden + c0 + v] = o[v];
  }
}

// kConvWindowRows consecutive rows of one sequence and V channels a thread (short_conv_window, 3
// taps): each row's B and x loaded once, not once for each of the 3 rows that read it (the per-row
// kernel ran at half the copy bandwidth on an H200; docs/cuda-backend.md).
template <typename T, int V>
__global__ void short_conv_window_kernel(T* out, const T* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len,
                                         int64_t hidden) {
  constexpr int R = kConvWindowRows;
  const int64_t groups = hidden / V, chunks = (seq_len + R - 1) / R, n = n_seq * chunks * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t sc = i / groups, c0 = (i - sc * groups) * V, s = sc / chunks, t0 = (sc - s * chunks) * R;
    const int n_r = seq_len - t0 < R ? int(seq_len - t0) : R;
    const int64_t row0 = s * seq_len + t0;
    alignas(16) T o[R][V];
    short_conv_window<T, V, R, 3>(o, bcx, conv_w, row0, t0, n_r, c0, hidden);
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < n_r) *reinterpret_cast<uint4*>(out + (row0 + r) * hidden + c0) = *reinterpret_cast<const uint4*>(o[r]);
  }
}

constexpr int kMaxTaps = 16;  // L of the step kernels (LFM2: 3)

// V values of T from src (one 16-byte load when V * sizeof(T) == 16).
template <typename T, int V>
__device__ __forceinline__ void load_v(T (&dst)[V], const T* src) {
  if constexpr (V * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) dst[v] = src[v];
  }
}

// V values of T to dst (one 16-byte store when V * sizeof(T) == 16).
template <typename T, int V>
__device__ __forceinline__ void store_v(T* dst, const T (&src)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) dst[v] = src[v];
  }
}
// V floats (float4 loads and stores when V is a multiple of 4; the state rows are then 16-byte aligned).
template <int V>
__device__ __forceinline__ void load_f32(float (&dst)[V], const float* src) {
#pragma unroll
  for (int v = 0; v < V; v += (V % 4 == 0 ? 4 : 1)) {
    if constexpr (V % 4 == 0)
      *reinterpret_cast<float4*>(dst + v) = *reinterpret_cast<const float4*>(src + v);
    else
      dst[v] = src[v];
  }
}
template <int V>
__device__ __forceinline__ void store_f32(float* dst, const float (&src)[V]) {
#pragma unroll
  for (int v = 0; v < V; v += (V % 4 == 0 ? 4 : 1)) {
    if constexpr (V % 4 == 0)
      *reinterpret_cast<float4*>(dst + v) = *reinterpret_cast<const float4*>(src + v);
    else
      dst[v] = src[v];
  }
}

// A step's rows, each from its slot's state (short_conv_step): one thread per (row, V consecutive
// channels: 16-byte loads and stores where the rows allow), taps in order j = 0..L-1, u = B * x of
// each position from its rows in bcx (q >= first_pos) or from its slot's state (q < first_pos), as
// short_conv_kernel; the states are only read.
template <typename T, int V>
__global__ void conv_step_kernel(T* out, const T* bcx, const float* conv_w, const float* state, const PagedSeq* seqs,
                                 int n_seqs, int64_t n_rows, int64_t hidden, int64_t L) {
  const int64_t groups = hidden / V, n = n_rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups, c0 = (i - row * groups) * V;
    const int s = find_seq(seqs, n_seqs, row);
    if (s < 0) continue;
    const PagedSeq sq = seqs[s];
    if (row >= sq.row + sq.n_rows) continue;  // a row of no sequence
    const float* st = state + int64_t(sq.table_row) * (L - 1) * hidden;
    const int64_t t = sq.first_pos + (row - sq.row);
    float z[V] = {};
    for (int64_t j = 0; j < L; ++j) {
      const int64_t q = t - (L - 1) + j;
      if (q < 0) continue;
      float u[V];
      if (q >= sq.first_pos) {
        const T* src = bcx + (sq.row + (q - sq.first_pos)) * 3 * hidden + c0;
        alignas(16) T b[V], x[V];
        load_v<T, V>(b, src);
        load_v<T, V>(x, src + 2 * hidden);
#pragma unroll
        for (int v = 0; v < V; ++v) u[v] = to_f32(b[v]) * to_f32(x[v]);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) u[v] = st[(q - (sq.first_pos - (L - 1))) * hidden + c0 + v];
      }
#pragma unroll
      for (int v = 0; v < V; ++v) z[v] += conv_w[(c0 + v) * L + j] * u[v];
    }
    alignas(16) T cg[V], o[V];
    load_v<T, V>(cg, bcx + row * 3 * hidden + hidden + c0);
#pragma unroll
    for (int v = 0; v < V; ++v) o[v] = from_f32<T>(to_f32(cg[v]) * z[v]);
    if constexpr (V * sizeof(T) == 16)
      *reinterpret_cast<uint4*>(out + row * hidden + c0) = *reinterpret_cast<const uint4*>(o);
    else
#pragma unroll
      for (int v = 0; v < V; ++v) out[row * hidden + c0 + v] = o[v];
  }
}

// Then each slot's new state: u of the L-1 positions before first_pos + ends[s] (0 before position
// 0), one thread per (sequence, channel), its old values read first.
template <typename T>
__global__ void conv_step_state_kernel(float* state, const T* bcx, const PagedSeq* seqs, const int32_t* ends,
                                       int64_t n_seqs, int64_t hidden, int64_t L) {
  const int64_t n = n_seqs * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / hidden, c = i - s * hidden;
    const PagedSeq sq = seqs[s];
    float* st = state + int64_t(sq.table_row) * (L - 1) * hidden;
    float old[kMaxTaps];
    for (int64_t j = 0; j < L - 1; ++j) old[j] = st[j * hidden + c];
    const int64_t end = sq.first_pos + (ends ? ends[s] : sq.n_rows);
    for (int64_t j = 0; j < L - 1; ++j) {
      const int64_t q = end - (L - 1) + j;
      float u = 0.f;
      if (q >= sq.first_pos) {
        const T* src = bcx + (sq.row + (q - sq.first_pos)) * 3 * hidden;
        u = to_f32(src[c]) * to_f32(src[2 * hidden + c]);
      } else if (q >= 0) {
        u = old[q - (sq.first_pos - (L - 1))];
      }
      st[j * hidden + c] = u;
    }
  }
}

// Steps whose entries are all one row (decode steps): the output and the state's shift in one
// thread per (sequence, V consecutive channels), with conv_step_kernel's and conv_step_state_kernel's
// arithmetic per channel. Block (s, b) takes sequence s's channel groups [b blockDim, +blockDim): no
// index division, 16-byte loads of the rows and the state where V * sizeof(T) == 16 (a thread per
// channel took 12.2 us a layer at 256 rows on an H100). KL: L at compile time (the state in
// registers), or 0 for any L <= kMaxTaps.
template <typename T, int V, int KL>
__global__ void conv_step_rows_kernel(T* out, const T* bcx, const float* conv_w, float* state, const PagedSeq* seqs,
                                      const int32_t* ends, int64_t hidden, int64_t L_arg) {
  const int64_t L = KL > 0 ? KL : L_arg;
  const int64_t s = blockIdx.x, c0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (c0 >= hidden) return;
  const PagedSeq sq = seqs[s];
  float* st = state + int64_t(sq.table_row) * (L - 1) * hidden + c0;
  constexpr int kRows = KL > 0 ? KL : kMaxTaps;
  float old[kRows][V];
#pragma unroll
  for (int j = 0; j < kRows - 1; ++j)
    if (j < L - 1) load_f32<V>(old[j], st + j * hidden);
  const T* r = bcx + int64_t(sq.row) * 3 * hidden + c0;
  alignas(16) T b[V], x[V], cg[V], o[V];
  load_v<T, V>(b, r);
  load_v<T, V>(cg, r + hidden);
  load_v<T, V>(x, r + 2 * hidden);
  float u[V];
#pragma unroll
  for (int v = 0; v < V; ++v) u[v] = to_f32(b[v]) * to_f32(x[v]);
  const int64_t t = sq.first_pos;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    float z = 0.f;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j >= L || t - (L - 1) + j < 0) continue;
      z += conv_w[(c0 + v) * L + j] * (j < L - 1 ? old[j][v] : u[v]);
    }
    o[v] = from_f32<T>(to_f32(cg[v]) * z);
  }
  store_v<T, V>(out + int64_t(sq.row) * hidden + c0, o);
  const int64_t end = t + (ends ? ends[s] : 1);
#pragma unroll
  for (int j = 0; j < kRows - 1; ++j) {
    if (j >= L - 1) break;
    const int64_t q = end - (L - 1) + j, from = q - (t - (L - 1));  // the old row that moves to j
    float nv[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float kept = 0.f;  // old[from][v] by selects: the row index is not known at compile time
#pragma unroll
      for (int i = 0; i < kRows - 1; ++i)
        if (i == from) kept = old[i][v];
      nv[v] = q < 0 ? 0.f : q >= t ? u[v] : kept;
    }
    store_f32<V>(st + j * hidden, nv);
  }
}

}  // namespace

template <typename T>
void short_conv(T* out, const T* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden, int64_t L,
                cudaStream_t stream) {
  const int64_t n = n_seq * seq_len * hidden;
  if (n == 0) return;
  constexpr int V = 16 / sizeof(T);
  const bool vec = hidden % V == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(bcx) % 16 == 0;
  if (vec && L == 3)  // LFM2's
    short_conv_window_kernel<T, V><<<grid_for(n / V / kConvWindowRows, 256), 256, 0, stream>>>(out, bcx, conv_w,
                                                                                                n_seq, seq_len, hidden);
  else if (vec)
    short_conv_kernel<T, V><<<grid_for(n / V, 256), 256, 0, stream>>>(out, bcx, conv_w, n_seq * seq_len, seq_len,
                                                                      hidden, L);
  else
    short_conv_kernel<T, 1><<<grid_for(n, 256), 256, 0, stream>>>(out, bcx, conv_w, n_seq * seq_len, seq_len,
                                                                  hidden, L);
  CUDA_CHECK_LAUNCH("short_conv_kernel");
}

template <typename T>
void short_conv_step(T* out, const T* bcx, const float* conv_w, float* state, const PagedSeq* seqs, int64_t n_seqs,
                     const int32_t* ends, int64_t n_rows, int64_t max_seq_rows, int64_t hidden, int64_t L,
                     cudaStream_t stream) {
  LFM2_CHECK(L >= 1 && L <= kMaxTaps, "short_conv_step: L ", L, " outside [1, ", kMaxTaps, "]");
  LFM2_CHECK(n_seqs < (int64_t(1) << 31), "short_conv_step: ", n_seqs, " sequences");
  if (n_seqs == 0 || n_rows == 0) return;
  if (max_seq_rows == 1) {
    // one (sequence, V channels) a thread, one block row per sequence
    constexpr int V = 16 / sizeof(T);
    const bool vec = hidden % V == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(bcx) % 16 == 0 && reinterpret_cast<uintptr_t>(state) % 16 == 0;
    const int64_t groups = vec ? hidden / V : hidden, threads = std::min<int64_t>(256, (groups + 31) / 32 * 32);
    const dim3 grid(unsigned(n_seqs), unsigned((groups + threads - 1) / threads));
    const auto kernel = vec && L == 3 ? conv_step_rows_kernel<T, V, 3>  // LFM2's
                        : vec         ? conv_step_rows_kernel<T, V, 0>
                                      : conv_step_rows_kernel<T, 1, 0>;
    kernel<<<grid, unsigned(threads), 0, stream>>>(out, bcx, conv_w, state, seqs, ends, hidden, L);
    CUDA_CHECK_LAUNCH("conv_step_rows_kernel");
    return;
  }
  constexpr int V = 16 / sizeof(T);  // a prefill item's 8192 rows: 16-byte loads (0.23 -> ~0.05 ms at 2048 wide)
  if (hidden % V == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(bcx) % 16 == 0)
    conv_step_kernel<T, V><<<grid_for(n_rows * hidden / V, 256), 256, 0, stream>>>(out, bcx, conv_w, state, seqs,
                                                                                   int(n_seqs), n_rows, hidden, L);
  else
    conv_step_kernel<T, 1><<<grid_for(n_rows * hidden, 256 * 4), 256, 0, stream>>>(out, bcx, conv_w, state, seqs,
                                                                                   int(n_seqs), n_rows, hidden, L);
  CUDA_CHECK_LAUNCH("conv_step_kernel");
  if (L < 2) return;
  conv_step_state_kernel<<<grid_for(n_seqs * hidden, 256), 256, 0, stream>>>(state, bcx, seqs, ends, n_seqs, hidden,
                                                                             L);
  CUDA_CHECK_LAUNCH("conv_step_state_kernel");
}

#define INST(T)                                                                                                     \
  template void short_conv<T>(T*, const T*, const float*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);        \
  template void short_conv_step<T>(T*, const T*, const float*, float*, const PagedSeq*, int64_t, const int32_t*,   \
                                   int64_t, int64_t, int64_t, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
