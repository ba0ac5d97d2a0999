// Generation's attention kernels on the GPU (the CPU twins: the CPU stage's KV-cache copy,
// cpu::attention_decode). The conv state kernels are in short_conv.cu, the EOS rules in sample.cu.
//
// Positions: a row of a prefill (step 0) is at position row % seq_len of sequence
// first_seq + row / seq_len; a row of decode step `step` >= 1 (seq_len 1) is sequence first_seq + row
// at position lengths[first_seq + row] + step - 1 (lengths: the prompt lengths, on the device).
#include <cfloat>

#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

__device__ __forceinline__ int64_t position_of(int64_t row, int64_t seq_len, const int32_t* lengths,
                                               int64_t first_seq, int64_t step) {
  return step == 0 ? row % seq_len : int64_t(lengths[first_seq + row]) + step - 1;
}

__device__ __forceinline__ int64_t sequence_of(int64_t row, int64_t seq_len, int64_t first_seq, int64_t step) {
  return first_seq + (step == 0 ? row / seq_len : row);
}

// k and v of every row into the caches (n_seq_all, max_len, n_kv * head_dim).
template <typename T>
__global__ void kv_store_kernel(T* k_cache, T* v_cache, const T* qkv, int64_t n_rows, int64_t width, int64_t k_off,
                                int64_t v_off, int64_t kv, int64_t seq_len, const int32_t* lengths, int64_t first_seq,
                                int64_t step, int64_t max_len, const int64_t* at) {
  if (at) first_seq = at[0], step = at[1];
  const int64_t n = n_rows * kv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / kv, c = i - row * kv;
    const int64_t s = sequence_of(row, seq_len, first_seq, step), p = position_of(row, seq_len, lengths, first_seq, step);
    if (p >= max_len) continue;  // checked on the host; never written out of bounds
    const int64_t dst = (s * max_len + p) * kv + c;
    k_cache[dst] = qkv[row * width + k_off + c];
    v_cache[dst] = qkv[row * width + v_off + c];
  }
}

// One warp per (row, head): the query against cache positions 0..p with an online softmax in fp32;
// lane l owns dims l, l + 32, ... of the head.
constexpr int kMaxDimsPerLane = 4;  // head_dim <= 128

template <typename T>
__global__ void attention_decode_kernel(T* out, const T* qkv, const T* k_cache, const T* v_cache, int64_t n_rows,
                                        int64_t width, int n_heads, int n_kv_heads, int head_dim, float scale,
                                        const int32_t* lengths, int64_t first_seq, int64_t step, int64_t max_len,
                                        const int64_t* at) {
  if (at) first_seq = at[0], step = at[1];
  const int lane = threadIdx.x & 31;
  const int64_t item = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (item >= n_rows * n_heads) return;
  const int64_t row = item / n_heads;
  const int h = int(item - row * n_heads), kvh = h / (n_heads / n_kv_heads);
  const int64_t s = first_seq + row, t = int64_t(lengths[s]) + step - 1;
  const int64_t kv = int64_t(n_kv_heads) * head_dim;
  float q[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < head_dim ? to_f32(qkv[row * width + int64_t(h) * head_dim + d]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const T* kc = k_cache + s * max_len * kv + int64_t(kvh) * head_dim;
  const T* vc = v_cache + s * max_len * kv + int64_t(kvh) * head_dim;
  for (int64_t j = 0; j <= t && j < max_len; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) dot += q[i] * to_f32(kc[j * kv + d]);
    }
    const float score = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, score);
    const float keep = __expf(m - m_new), w = __expf(score - m_new);
    l = l * keep + w;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) acc[i] = acc[i] * keep + w * to_f32(vc[j * kv + d]);
    }
    m = m_new;
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) out[row * int64_t(n_heads) * head_dim + int64_t(h) * head_dim + d] = from_f32<T>(acc[i] * inv);
  }
}

}  // namespace

template <typename T>
void kv_cache_store(T* k_cache, T* v_cache, const T* qkv, int64_t n_rows, int64_t seq_len, int64_t n_heads,
                    int64_t n_kv_heads, int64_t head_dim, const int32_t* lengths, int64_t first_seq, int64_t step,
                    int64_t max_len, cudaStream_t stream, const int64_t* at) {
  if (n_rows == 0) return;
  const int64_t kv = n_kv_heads * head_dim, width = (n_heads + 2 * n_kv_heads) * head_dim;
  kv_store_kernel<<<grid_for(n_rows * kv, 256 * 4), 256, 0, stream>>>(k_cache, v_cache, qkv, n_rows, width,
                                                                      n_heads * head_dim, (n_heads + n_kv_heads) * head_dim,
                                                                      kv, seq_len, lengths, first_seq, step, max_len, at);
  CUDA_CHECK_LAUNCH("kv_store_kernel");
}

template <typename T>
void attention_decode(T* out, const T* qkv, const T* k_cache, const T* v_cache, int64_t n, int64_t n_heads,
                      int64_t n_kv_heads, int64_t head_dim, float scale, const int32_t* lengths, int64_t first_seq,
                      int64_t step, int64_t max_len, cudaStream_t stream, const int64_t* at) {
  LFM2_CHECK(head_dim <= 32 * kMaxDimsPerLane && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
             "attention_decode: head_dim ", head_dim, " (at most ", 32 * kMaxDimsPerLane, "), ", n_heads, " heads, ",
             n_kv_heads, " kv heads");
  LFM2_CHECK(step >= 1, "attention_decode: step ", step);
  if (n == 0) return;
  const int64_t warps = n * n_heads;
  const int64_t width = (n_heads + 2 * n_kv_heads) * head_dim;
  attention_decode_kernel<<<grid_for(warps * 32, 256), 256, 0, stream>>>(
      out, qkv, k_cache, v_cache, n, width, int(n_heads), int(n_kv_heads), int(head_dim), scale, lengths, first_seq,
      step, max_len, at);
  CUDA_CHECK_LAUNCH("attention_decode_kernel");
}

#define INST(T)                                                                                                   \
  template void kv_cache_store<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, \
                                  int64_t, int64_t, int64_t, cudaStream_t, const int64_t*);                      \
  template void attention_decode<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, float,  \
                                    const int32_t*, int64_t, int64_t, int64_t, cudaStream_t, const int64_t*);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
