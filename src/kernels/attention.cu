// Causal GQA attention on the GPU as one fused kernel with an online softmax (flash-attention
// style, fp32 scores, running max and sum): memory O(seq_len), no score matrix.
//
// bf16 / fp16: tensor cores (FlashAttention-2 style). A block of 4 warps owns 64 consecutive queries
// of one (sequence, head), 16 per warp; its Q rows stay in registers as mma fragments. Key/value
// tiles of 64 rows stream through shared memory (cp.async, double-buffered, zero-filled past the
// sequence end), S = Q K^T and O += P V run as mma.sync m16n8k16 with fp32 accumulators, and the
// softmax is online in fp32 (running max and sum per row, shared by the 4 lanes that hold a row's
// columns). P is rounded to the element type for the P V product, as flash-attention does.
// The heaviest query tiles (last in causal order) are scheduled first.
//
// fp32: exact SIMT FMAs. A block owns 64 queries, one query row per thread, held in registers
// with its fp32 accumulator; key/value tiles are staged in shared memory as fp32 (all threads read
// the same key at once: a broadcast) and the accumulator is rescaled once per tile
// (attention_simt.cuh: the tile's function, shared with the paged chunked prefill).
// Scores are pre-multiplied by log2(e) to use exp2f.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "kernels/attention_mma.cuh"
#include "kernels/attention_simt.cuh"
#include "kernels/cuda/device_info.h"
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
    simt_key_tile(ks, vs, qr, o, m, l, k0, qpos);
  }
  if (!valid) return;
  const float inv = 1.f / l;
  T* op = out + (row0 + qpos) * int64_t(n_heads) * HD + int64_t(h) * HD;
#pragma unroll
  for (int d = 0; d < HD; ++d) op[d] = from_f32<T>(o[d] * inv);
}


// ---------------------------------------------------------------- tensor cores (bf16 / fp16)
namespace tc {

// Block shapes: kWarps warps of 16 queries each, key/value tiles of BKV rows. (4, 64) in general;
// (2, 32) for sequences of at most 32 tokens, where a 64-query block would leave half its warps idle.

using namespace mma;

template <int HD, int kWarps, int BKV>
struct Smem {
  static constexpr int BQ = kWarps * 16;
  static constexpr int LD = HD + 8;  // padded rows: ldmatrix's 8 row addresses hit 8 distinct bank groups
  static constexpr int kQ = BQ * LD, kKV = BKV * LD;
  static constexpr size_t kBytes = size_t(kQ + 4 * kKV) * 2;  // Q, K[2], V[2]
};

// Keys and values k0 .. k0 + BKV - 1 (rows kv_stride apart from kb, vb) into stage `stage` of the
// double buffers sk, sv (rows LD apart); keys past the sequence end zero-filled.
template <typename T, int HD, int LD, int BKV, int kThreads>
__device__ __forceinline__ void load_kv_tile(T* sk, T* sv, int stage, const T* kb, const T* vb, int64_t k0,
                                             int64_t seq_len, int64_t kv_stride, int tid) {
  constexpr int kChunks = HD / 8, kKV = BKV * LD;
  T* dk = sk + stage * kKV;
  T* dv = sv + stage * kKV;
  for (int c = tid; c < BKV * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const int64_t kp = k0 + r;
    const bool ok = kp < seq_len;
    cp_async16(dk + r * LD + col, ok ? kb + kp * kv_stride + col : kb, ok);
    cp_async16(dv + r * LD + col, ok ? vb + kp * kv_stride + col : vb, ok);
  }
}

// Waits for stage st's copies (the tile from k0); when there is a next tile, issues its copies into
// the other stage first, so that they fly during this tile's products.
template <typename T, int HD, int LD, int BKV, int kThreads>
__device__ __forceinline__ void wait_tile(T* sk, T* sv, int st, bool next, const T* kb, const T* vb, int64_t k0,
                                          int64_t seq_len, int64_t kv_stride, int tid) {
  if (next) {
    load_kv_tile<T, HD, LD, BKV, kThreads>(sk, sv, st ^ 1, kb, vb, k0 + BKV, seq_len, kv_stride, tid);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// A lane's place in its warp's 16 queries: the warp's first query wq0, the lane's rows qpos0 and
// qpos1 (= qpos0 + 8), its lane and lane % 4 (the fragment columns it holds).
struct LaneRows {
  int64_t wq0, qpos0, qpos1;
  int lane, t4;
};

// S = Q K^T of the warp's rows against the key tile in ks: per 16 keys, one ldmatrix.x4 gives both
// 8-key n-tiles' B fragments for 16 dims.
template <typename T, int HD, int BKV, int LD>
__device__ __forceinline__ void tile_scores(float (&sc)[BKV / 8][4], const uint32_t (&qf)[HD / 16][4], const T* ks,
                                            int lane) {
  constexpr int NT = BKV / 8, KC = HD / 16;
#pragma unroll
  for (int j = 0; j < NT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc)
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
      uint32_t b[4];
      const int mi = lane >> 3;
      ldmatrix_x4(b, ks + (j * 8 + (mi >> 1) * 8 + (lane & 7)) * LD + kc * 16 + (mi & 1) * 8);
      mma16816<T>(sc[j], qf[kc], b[0], b[1]);
      mma16816<T>(sc[j + 1], qf[kc], b[2], b[3]);
    }
}

// The tile's scores from key k0 scaled and masked (causal, and keys past the end), each row's new
// max; O and the sums rescaled to it. base0 / base1: the max the rows' P are taken against.
template <int HD, int BKV>
__device__ __forceinline__ void mask_rescale(float (&sc)[BKV / 8][4], float (&o)[HD / 8][4], float& m0, float& m1,
                                             float& l0, float& l1, float& base0, float& base1, const LaneRows& r,
                                             int64_t k0, int64_t seq_len, float scale_log2) {
  constexpr int NT = BKV / 8, DT = HD / 8;
  const bool diag = k0 + BKV - 1 > r.wq0;  // some key of this tile lies after some query of the warp
  float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t key = k0 + j * 8 + 2 * r.t4 + e;
      float a = sc[j][e] * scale_log2, b = sc[j][2 + e] * scale_log2;
      if (diag || key >= seq_len) {
        if (key > r.qpos0 || key >= seq_len) a = -INFINITY;
        if (key > r.qpos1 || key >= seq_len) b = -INFINITY;
      }
      sc[j][e] = a;
      sc[j][2 + e] = b;
      tmax0 = fmaxf(tmax0, a);
      tmax1 = fmaxf(tmax1, b);
    }
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, o2));
    tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, o2));
  }
  // rows whose keys are all masked so far keep m = -inf; their alpha and p are then 0
  const float mn0 = fmaxf(m0, tmax0), mn1 = fmaxf(m1, tmax1);
  base0 = mn0 == -INFINITY ? 0.f : mn0;
  base1 = mn1 == -INFINITY ? 0.f : mn1;
  const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
  m0 = mn0;
  m1 = mn1;
  l0 *= alpha0;
  l1 *= alpha1;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    o[j][0] *= alpha0;
    o[j][1] *= alpha0;
    o[j][2] *= alpha1;
    o[j][3] *= alpha1;
  }
}

// P = 2^(s - base) (as A fragments, 16 keys per k-chunk) into the sums and, rounded to T, O += P V
// over the value tile in vs.
template <typename T, int HD, int BKV, int LD>
__device__ __forceinline__ void tile_pv(float (&o)[HD / 8][4], float& l0, float& l1, const float (&sc)[BKV / 8][4],
                                        float base0, float base1, const T* vs, int lane) {
  constexpr int DT = HD / 8;
#pragma unroll
  for (int kc = 0; kc < BKV / 16; ++kc) {
    uint32_t pa[4];
    float p[2][4];
#pragma unroll
    for (int hlf = 0; hlf < 2; ++hlf) {
      const int j = 2 * kc + hlf;
      p[hlf][0] = exp2f(sc[j][0] - base0);
      p[hlf][1] = exp2f(sc[j][1] - base0);
      p[hlf][2] = exp2f(sc[j][2] - base1);
      p[hlf][3] = exp2f(sc[j][3] - base1);
      l0 += p[hlf][0] + p[hlf][1];
      l1 += p[hlf][2] + p[hlf][3];
    }
    pa[0] = pack2<T>(p[0][0], p[0][1]);
    pa[1] = pack2<T>(p[0][2], p[0][3]);
    pa[2] = pack2<T>(p[1][0], p[1][1]);
    pa[3] = pack2<T>(p[1][2], p[1][3]);
#pragma unroll
    for (int d = 0; d < DT; d += 2) {
      uint32_t b[4];
      const int mi = lane >> 3;
      ldmatrix_x4_trans(b, vs + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * LD + d * 8 + (mi >> 1) * 8);
      mma16816<T>(o[d], pa, b[0], b[1]);
      mma16816<T>(o[d + 1], pa, b[2], b[3]);
    }
  }
}

// One key tile (stage st of sk / sv, from key k0) for a warp's 16 queries: its scores, the causal
// mask and online softmax, O += P V. o, m0 / m1, l0 / l1: the warp's running O, maxima and sums.
template <typename T, int HD, int BKV, int LD, int kKV>
__device__ __forceinline__ void warp_tile(float (&o)[HD / 8][4], float& m0, float& m1, float& l0, float& l1,
                                          const uint32_t (&qf)[HD / 16][4], const T* sk, const T* sv, int st,
                                          int64_t k0, const LaneRows& r, int64_t seq_len, float scale_log2) {
  float sc[BKV / 8][4], base0, base1;
  tile_scores<T, HD, BKV, LD>(sc, qf, sk + st * kKV, r.lane);
  mask_rescale<HD, BKV>(sc, o, m0, m1, l0, l1, base0, base1, r, k0, seq_len, scale_log2);
  tile_pv<T, HD, BKV, LD>(o, l0, l1, sc, base0, base1, sv + st * kKV, r.lane);
}

template <typename T, int HD, int kWarps, int BKV>
__global__ void __launch_bounds__(kWarps * 32)
    attention_tc_kernel(T* out, const T* q, const T* k, const T* v, int64_t seq_len, int n_heads, int group,
                        int64_t n_qtiles, int64_t q_stride, int64_t kv_stride, float scale_log2) {
  static_assert(HD % 16 == 0 && HD <= 256 && BKV % 16 == 0, "head_dim, key tile");
  using S = Smem<HD, kWarps, BKV>;
  constexpr int kThreads = kWarps * 32, BQ = S::BQ;
  constexpr int LD = S::LD, DT = HD / 8, KC = HD / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sk = sq + S::kQ;       // [2][BKV][LD]
  T* sv = sk + 2 * S::kKV;  // [2][BKV][LD]

  // heaviest query tiles first: blocks are numbered (reversed q tile, sequence x head)
  const int64_t per_tile = int64_t(gridDim.x) / n_qtiles;
  const int64_t qt = n_qtiles - 1 - int64_t(blockIdx.x) / per_tile;
  const int64_t sh = int64_t(blockIdx.x) % per_tile;
  const int h = int(sh % n_heads);
  const int64_t s = sh / n_heads;
  const int kvh = h / group;
  const int64_t row0 = s * seq_len, q0 = qt * BQ;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;

  const T* qb = q + row0 * q_stride + int64_t(h) * HD;
  const T* kb = k + row0 * kv_stride + int64_t(kvh) * HD;
  const T* vb = v + row0 * kv_stride + int64_t(kvh) * HD;
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row

  for (int c = tid; c < BQ * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const int64_t qp = q0 + r;
    const bool ok = qp < seq_len;
    cp_async16(sq + r * LD + col, ok ? qb + qp * q_stride + col : qb, ok);
  }
  const int64_t k_end = min(q0 + BQ, seq_len);  // keys this block can see
  const int n_tiles = int((k_end + BKV - 1) / BKV);
  load_kv_tile<T, HD, LD, BKV, kThreads>(sk, sv, 0, kb, vb, 0, seq_len, kv_stride, tid);
  cp_async_commit();

  const int64_t wq0 = q0 + warp * 16;  // this warp's first query
  const bool warp_active = wq0 < seq_len;
  const int64_t qpos0 = wq0 + g, qpos1 = wq0 + g + 8;
  const LaneRows rows{wq0, qpos0, qpos1, lane, t4};

  uint32_t qf[KC][4];
  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int t = 0; t < n_tiles; ++t) {
    const int st = t & 1;
    const int64_t k0 = int64_t(t) * BKV;
    wait_tile<T, HD, LD, BKV, kThreads>(sk, sv, st, t + 1 < n_tiles, kb, vb, k0, seq_len, kv_stride, tid);
    __syncthreads();
    if (t == 0)  // Q's A fragments, once its copies are in
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) ldmatrix_x4(qf[kc], sq + (warp * 16 + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
    // a warp whose queries all precede this tile (causal) or lie past the end has nothing to do
    if (warp_active && k0 <= wq0 + 15)
      warp_tile<T, HD, BKV, LD, S::kKV>(o, m0, m1, l0, l1, qf, sk, sv, st, k0, rows, seq_len, scale_log2);
    __syncthreads();  // this stage is refilled by the next iteration's load
  }
  if (!warp_active) return;
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  const int64_t out_stride = int64_t(n_heads) * HD;
  T* ob = out + row0 * out_stride + int64_t(h) * HD;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int col = j * 8 + 2 * t4;
    if (qpos0 < seq_len)
      *reinterpret_cast<uint32_t*>(ob + qpos0 * out_stride + col) = pack2<T>(o[j][0] * inv0, o[j][1] * inv0);
    if (qpos1 < seq_len)
      *reinterpret_cast<uint32_t*>(ob + qpos1 * out_stride + col) = pack2<T>(o[j][2] * inv1, o[j][3] * inv1);
  }
}

template <typename T, int HD, int kWarps, int BKV>
void launch_shape(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
                  int64_t n_kv_heads, float scale, cudaStream_t stream, int64_t q_stride, int64_t kv_stride) {
  using S = Smem<HD, kWarps, BKV>;
  const int64_t n_qtiles = (seq_len + S::BQ - 1) / S::BQ;
  const int64_t blocks = n_qtiles * n_heads * n_seq;
  LFM2_CHECK(blocks < (int64_t(1) << 31), "attention: ", blocks, " blocks is too many for one launch");
  auto kernel = attention_tc_kernel<T, HD, kWarps, BKV>;
  constexpr size_t smem = S::kBytes;
  if (smem > (size_t(48) << 10)) raise_smem_limit(reinterpret_cast<const void*>(kernel), int(smem));
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(out, q, k, v, seq_len, int(n_heads),
                                                          int(n_heads / n_kv_heads), n_qtiles, q_stride, kv_stride,
                                                          scale * 1.4426950408889634f);
  CUDA_CHECK_LAUNCH("attention_tc_kernel");
}

template <typename T, int HD>
void launch(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
            int64_t n_kv_heads, float scale, cudaStream_t stream, int64_t q_stride, int64_t kv_stride) {
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
                        static_cast<const void*>(out)})
    LFM2_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "attention: 16-bit q/k/v/out must be 16-byte aligned");
  LFM2_CHECK(q_stride % 8 == 0 && kv_stride % 8 == 0, "attention: 16-bit row strides must be multiples of 8");
  if (seq_len <= 32)
    launch_shape<T, HD, 2, 32>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
  else
    launch_shape<T, HD, 4, 64>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
}

}  // namespace tc

template <typename T, int HD>
void launch_simt(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
                 int64_t n_kv_heads, float scale, cudaStream_t stream, int64_t q_stride, int64_t kv_stride) {
  const int64_t n_qtiles = (seq_len + kBQ - 1) / kBQ;
  const int64_t blocks = n_qtiles * n_heads * n_seq;
  LFM2_CHECK(blocks < (int64_t(1) << 31), "attention: ", blocks, " blocks is too many for one launch");
  attention_kernel<T, HD><<<unsigned(blocks), kBQ, 0, stream>>>(out, q, k, v, seq_len, int(n_heads),
                                                                int(n_heads / n_kv_heads), n_qtiles, q_stride,
                                                                kv_stride, scale * 1.4426950408889634f);
  CUDA_CHECK_LAUNCH("attention_kernel");
}

template <typename T, int HD>
void launch(T* out, const T* q, const T* k, const T* v, int64_t n_seq, int64_t seq_len, int64_t n_heads,
            int64_t n_kv_heads, float scale, cudaStream_t stream, int64_t q_stride, int64_t kv_stride) {
  if constexpr (std::is_same<T, float>::value)
    launch_simt<T, HD>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
  else
    tc::launch<T, HD>(out, q, k, v, n_seq, seq_len, n_heads, n_kv_heads, scale, stream, q_stride, kv_stride);
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
