// Causal GQA attention on the GPU as one fused kernel with an online softmax (flash-attention
// style, fp32 scores, running max and sum): memory O(seq_len), no score matrix.
//
// A block owns 64 consecutive queries of one (sequence, head), one query row per thread, held in
// registers with its fp32 accumulator. It walks the key/value tiles up to its last query, staging
// each tile in shared memory as fp32 (all threads read the same key at once: a broadcast), and
// rescales the accumulator once per tile. Scores are pre-multiplied by log2(e) to use exp2f.
#include <cmath>

#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kBQ = 64;  // queries per block = threads per block

template <typename T, int HD>
__global__ void __launch_bounds__(kBQ) attention_kernel(T* out, const T* q, const T* k, const T* v, int64_t seq_len,
                                                        int n_heads, int group, int64_t n_qtiles, int64_t q_stride,
                                                        int64_t kv_stride, float scale_log2) {
  constexpr int kBKV = HD <= 64 ? 32 : 16;  // keys per tile
  __shared__ __align__(16) float ks[kBKV][HD];
  __shared__ __align__(16) float vs[kBKV][HD];

  int64_t blk = blockIdx.x;
  const int64_t qt = blk % n_qtiles;
  blk /= n_qtiles;
  const int h = int(blk % n_heads);
  const int64_t s = blk / n_heads;
  const int kvh = h / group;
  const int64_t row0 = s * seq_len;
  const int64_t q0 = qt * kBQ, qpos = q0 + threadIdx.x;
  const bool valid = qpos < seq_len;

  float qr[HD], o[HD];
  const T* qp = q + (row0 + (valid ? qpos : 0)) * q_stride + int64_t(h) * HD;
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    qr[d] = valid ? to_f32(qp[d]) * scale_log2 : 0.f;
    o[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;

  const int64_t k_end = min(q0 + kBQ, seq_len);
  const T* kb = k + row0 * kv_stride + int64_t(kvh) * HD;
  const T* vb = v + row0 * kv_stride + int64_t(kvh) * HD;
  for (int64_t k0 = 0; k0 < k_end; k0 += kBKV) {
    __syncthreads();  // the previous tile is no longer read
    for (int i = threadIdx.x; i < kBKV * HD; i += kBQ) {
      const int j = i / HD, d = i - j * HD;
      const int64_t kp = k0 + j;
      ks[j][d] = kp < seq_len ? to_f32(kb[kp * kv_stride + d]) : 0.f;
      vs[j][d] = kp < seq_len ? to_f32(vb[kp * kv_stride + d]) : 0.f;
    }
    __syncthreads();

    float sc[kBKV];
    float tmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBKV; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 kk = *reinterpret_cast<const float4*>(&ks[j][d]);
        acc += qr[d] * kk.x + qr[d + 1] * kk.y + qr[d + 2] * kk.z + qr[d + 3] * kk.w;
      }
      sc[j] = (k0 + j <= qpos) ? acc : -INFINITY;
      tmax = fmaxf(tmax, sc[j]);
    }
    const float m_new = fmaxf(m, tmax);
    if (m_new == -INFINITY) continue;  // nothing visible yet (only rows past the sequence end)
    const float alpha = exp2f(m - m_new);
    l *= alpha;
#pragma unroll
    for (int d = 0; d < HD; ++d) o[d] *= alpha;
#pragma unroll
    for (int j = 0; j < kBKV; ++j) {
      const float p = exp2f(sc[j] - m_new);
      l += p;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 vv = *reinterpret_cast<const float4*>(&vs[j][d]);
        o[d] += p * vv.x;
        o[d + 1] += p * vv.y;
        o[d + 2] += p * vv.z;
        o[d + 3] += p * vv.w;
      }
    }
    m = m_new;
  }
  if (!valid) return;
  const float inv = 1.f / l;
  T* op = out + (row0 + qpos) * int64_t(n_heads) * HD + int64_t(h) * HD;
#pragma unroll
  for (int d = 0; d < HD; ++d) op[d] = from_f32<T>(o[d] * inv);
}

template <typename T, int HD>
void launch(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
            int64_t n_kv_heads, float scale, cudaStream_t stream, int64_t q_stride, int64_t kv_stride) {
  const int64_t n_qtiles = (seq_len + kBQ - 1) / kBQ;
  const int64_t blocks = n_qtiles * n_heads * n_seq;
  LFM2_CHECK(blocks < (int64_t(1) << 31), "attention: ", blocks, " blocks is too many for one launch");
  attention_kernel<T, HD><<<unsigned(blocks), kBQ, 0, stream>>>(out, q, k, v, seq_len, int(n_heads),
                                                                int(n_heads / n_kv_heads), n_qtiles, q_stride,
                                                                kv_stride, scale * 1.4426950408889634f);
  CUDA_CHECK_LAUNCH("attention_kernel");
}

}  // namespace

template <typename T>
void attention(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, float scale, cudaStream_t stream, int64_t q_stride,
               int64_t kv_stride) {
  LFM2_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: ", n_heads, " heads not a multiple of ",
             n_kv_heads, " kv heads");
  if (n_seq * seq_len == 0) return;
  if (q_stride == 0) q_stride = n_heads * head_dim;
  if (kv_stride == 0) kv_stride = n_kv_heads * head_dim;
  switch (head_dim) {
    case 16: return launch<T, 16>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
    case 32: return launch<T, 32>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
    case 64: return launch<T, 64>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
    case 128: return launch<T, 128>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
    default: LFM2_FAIL("attention: head_dim ", head_dim, " not supported on CUDA (16, 32, 64 or 128)");
  }
}

#define INST(T)                                                                                                \
  template void attention<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, float, \
                             cudaStream_t, int64_t, int64_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
