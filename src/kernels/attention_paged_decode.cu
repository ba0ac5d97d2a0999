// Flash-decoding over a paged KV cache (cpu::attention_paged for one row per sequence): split-KV
// blocks write partial softmax states, a second kernel merges them.
//
// Split (exact mode, the only one): a sequence of cache length len (its row's position + 1) is cut
// into splits of tiles_per_split(len) tiles of kTile = 64 positions, starting at position 0: at
// least 8 tiles (512 positions), more once len passes 16 splits' worth, so at most kMaxSplits = 16
// splits. Longer splits than the first rule's (4 tiles, up to 64 splits) pay a block's fixed costs
// (its Q, the pipeline's fill and drain, the warps' merge, a partial state) over more positions:
// H100, 32/8 heads, hd 64, pages of 16, the fp8 cache at 32 x 10,240 220 -> ~195 us, bf16 261 ->
// ~250. The split is a function of len alone and the merge runs over the splits in order, so a row's
// bits never depend on the batch, the other rows, the page size or the placement of pages.
//
// Pass 1, one block of 4 warps per (sequence, split, KV head), the KV heads of one position range
// side by side so that the lines of a cache row are read together. bf16 / fp16 on the tensor cores:
// the group's query heads are rows 0..group-1 of one 16-row mma A operand (zero below), so each K/V
// tile read from the cache serves every query head of the KV head (GQA); 64-position tiles stream
// through shared memory in a 4-stage cp.async pipeline (16-byte copies into XOR-swizzled rows,
// positions past the length zero-filled and never read; see the variants below), warp w takes
// positions 16w..16w+15 of each tile: S = Q K^T and O += P V as m16n8k16 mma with fp32
// accumulators, an online softmax in fp32 (log2 units), P rounded to the element type for P V as
// in attention.cu. By default a warp scores two tiles' positions (32) as one round: both tiles' S,
// one max / rescale / exp round, then both P V (fewer serial chains a position, two mma chains side
// by side; the pipeline then refills a round's two stages at once). With group <= 8 the A rows
// 8..15 hold no query head: their max, exp, sum and rescale are skipped and their P is 0 (the live
// rows' bits are the same). K's head dims are permuted with Q's (k_dim: any permutation of the mma
// k index works if Q and K agree), so a lane's B fragments of all k chunks are HD / 4 contiguous
// head dims of its row, read at once. The 4 warps' states are merged in warp
// order in shared memory and the split's (O unnormalised, max, sum) written to the workspace.
// fp32: SIMT, exact FMAs; tiles of 32 positions in shared memory, each warp taking query heads of
// the group, lane j scoring position j of the tile, then lanes owning head dims for P V.
//
// Pass 2, one warp per (sequence, query head), launched as pass 1's programmatic dependent: the
// global max over its splits, the splits' sums (a warp sum: a fixed order) and outputs (in split
// order) rescaled, out = O / L in the element type.
//
// fp8 cache (attention_decode_paged_fp8, bf16 / fp16): the stages hold a tile's e4m3 bytes (16-byte
// units XOR-swizzled by their 128-byte line) and its rows' fp32 scales (cp.async, 16 and 4 bytes),
// one barrier a round as for T. Each warp widens only its own positions (kv_fp8.cuh: e4m3 * scale
// in fp32, rounded to T): K straight into the mma B fragments (with the permuted head dims a lane
// reads its row's HD / 4 bytes at once: one 16-byte unit at head_dim 64), V into the warp's 16 rows
// of a T tile per tile of the round (__syncwarp, then ldmatrix.trans as for T). The mma operands are
// the T kernel's on the dequantized cache rounded to T, so the bits are (for every variant, as the
// T kernel's of the same variant); half the cache bytes a position; the split, the rounds, the merge
// and their order are the T kernel's.
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/env.h"
#include "kernels/attention_decode_tc.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/kv_fp8.cuh"

namespace lfm2::cuda {
namespace {

using namespace mma;
using namespace decode;  // kTile, kWarps, kThreads, kMaxGroup, Split, DecodeSmem, DecodeBlock

constexpr int kMinTilesPerSplit = 8, kMaxSplits = 16;

__host__ __device__ __forceinline__ int tiles_per_split(int len) {
  const int tiles = (len + kTile - 1) / kTile;
  const int t = (tiles + kMaxSplits - 1) / kMaxSplits;
  return t > kMinTilesPerSplit ? t : kMinTilesPerSplit;
}

__host__ __device__ __forceinline__ int splits_of(int len) {
  const int tiles = (len + kTile - 1) / kTile, tps = tiles_per_split(len);
  return (tiles + tps - 1) / tps;
}

// The most splits of any length up to max_len: the workspace's and the grid's width.
int64_t max_splits(int64_t max_len) {
  const int64_t tiles = (max_len + kTile - 1) / kTile;
  return std::max<int64_t>(1, std::min<int64_t>(kMaxSplits, (tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit));
}

__device__ __forceinline__ Split split_of_block(const PagedSeq* seqs, int n_kv, int ms) {
  Split s;
  s.kvh = int(blockIdx.x % unsigned(n_kv));
  s.split = int((blockIdx.x / unsigned(n_kv)) % unsigned(ms));
  s.seq = int(blockIdx.x / unsigned(n_kv * ms));
  const PagedSeq sq = seqs[s.seq];
  const int len = sq.first_pos + 1, span = tiles_per_split(len) * kTile;
  s.row = sq.row;
  s.start = s.split * span;
  s.end = min(len, s.start + span);
  s.active = s.start < len;
  return s;
}

// Variants: the same arithmetic, so the same bits, with different memory movement (chosen at the
// first call: LFM2_DECODE_VARIANT, else kDefaultVariant). Bit 0: the L2 256-byte prefetch hint on
// the K/V copies; bit 1: unpadded, XOR-swizzled K/V stages, 4 deep (3 at head_dim 128: 256 positions
// in flight at once, 3 blocks per SM at head_dim 64) instead of padded rows 3 deep;
// bit 2: the merge launched as a programmatic dependent of pass 1 (its launch overlaps pass 1's tail).
// Measured on an H100 at 32 x 10240 positions, pages of 16 shuffled (32/8 heads, hd 64, bf16; splits
// of 4 tiles then): 273.5, 267.0, 261.0, 264.3, 272.3, 265.6, 259.3, 262.6 us for variants 0..7.
// Bits 3-6 (launch_tc) change the arithmetic's order, so the bits (the same for T and the fp8 cache
// in each): bit 3 rounds of 2 tiles (32 positions a warp) on the swizzled stages without the L2 hint
// (else 16), bit 4 all 16 A rows (else the half A operand when group <= 8), bit 5 the fp8 cache's
// rounds through one V T tile (45 KB, 96 registers: 5 blocks an SM, else two tiles, 53 KB, 4 blocks),
// bit 6 K's head dims permuted (rounds of 2 only). fp8 cache at 32 x 10,240 / 32 x 8,192 / 256 x
// 1,024 / 8 x 32,768 (H100, AT32 call 2; main's kernel 188.5 / 155.2 / 152.2 / 153.1 us): 6 184.2 /
// 148.3 / 145.8 / 159.9, 14 180.8 / 148.1 / 146.6 / 146.6, 46 181.3 / 144.3 / 141.7 / 161.3, 78
// 178.9 / 145.7 / 144.5 / 146.2, 110 181.4 / 144.6 / 141.6 / 157.5 (5 blocks an SM lose at 8 x
// 32,768: 1,024 blocks make 1.55 waves of 660 against 1.94 of 528); the bf16 cache 247-250 / 200-202 /
// 199-201 / 194-198 for all. 78 is the default (110 on an H200, below).
// Where the DRAM passes 4.2 TB/s (an H200) the fp8 cache's rounds go through one V T tile (bit 5:
// 5 blocks an SM instead of 4; the bf16 cache's kernel is the same as 78's): one H200
// (.bench/s17/call4.sh), fp8 cache at 32 x 10,240 / 32 x 8,192 / 256 x 1,024 / 8 x 32,768, 154.5 /
// 129.7 / 127.9 / 126.1 us with 110 against 78's 164.5 / 137.9 / 136.6 / 126.5.
constexpr int kDefaultVariant = 6 | 8 | 64, kFastDramVariant = kDefaultVariant | 32;

// LFM2_DECODE_VARIANT once (-1: unset); the default per call, for the device the call runs on
// (device_info caches it), so a process driving an H100 and an H200 uses each one's default.
int decode_variant() {
  static const int env = int(env_whole("LFM2_DECODE_VARIANT", -1, 0, 127));
  if (env >= 0) return env;
  return device_info(current_device()).fast_dram() ? kFastDramVariant : kDefaultVariant;
}

// KV: T, or uint8_t for an fp8 cache (k_scale, v_scale its scale pools; null otherwise).
// The fp8 kernels' registers held to what lets the blocks their shared memory allows (at most 5) be
// resident: unbounded, the 16-position kernel took 122 registers (4 blocks an SM) after the
// round's refactor, against 96 (5 blocks, no spills) when held.
template <int HD, bool kSwizzle, bool kF8, int NT, bool kV1>
constexpr int min_blocks() {
  if (!kF8) return 1;
  const int b = int((size_t(227) << 10) / (DecodeSmem<HD, kSwizzle, kF8, NT, kV1>::kBytes + 1024));
  return b < 5 ? b : 5;
}

template <typename T, int HD, bool kSwizzle, bool kL2Prefetch, typename KV, int NT, bool kHalf, bool kV1, bool kPK>
__global__ void __launch_bounds__(kThreads, (min_blocks<HD, kSwizzle, std::is_same<KV, uint8_t>::value, NT, kV1>()))
    decode_tc_kernel(float* part_o, float2* part_ml, const T* q, const KV* k_pool, const KV* v_pool,
                     const float* k_scale, const float* v_scale, const PagedSeq* seqs, const int32_t* block_table,
                     int max_pages, int shift, int n_heads, int n_kv, int group, int ms, int64_t q_stride,
                     float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Split sp = split_of_block(seqs, n_kv, ms);
  if (!sp.active) return;
  const PagedRows rows{block_table + int64_t(seqs[sp.seq].table_row) * max_pages, shift, n_kv * HD};
  DecodeBlock<T, HD, kSwizzle, kL2Prefetch, KV, NT, kHalf, kV1, kPK> block(smem_raw, sp, rows, k_pool, v_pool, k_scale,
                                                                           v_scale, n_kv, scale_log2);
  block.load_q(q + int64_t(sp.row) * q_stride + int64_t(sp.kvh) * group * HD, group);
  block.run();
  block.write_partial(smem_raw, part_o, part_ml, n_heads, group, ms);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    decode_simt_kernel(float* part_o, float2* part_ml, const float* q, const float* k_pool, const float* v_pool,
                       const PagedSeq* seqs, const int32_t* block_table, int max_pages, int shift, int n_heads,
                       int n_kv, int group, int ms, int64_t q_stride, float scale_log2) {
  constexpr int kKeys = 32, LDF = HD + 4, kChunks = HD / 4, kPer = (HD + 31) / 32;
  constexpr int kHeadsPerWarp = kMaxGroup / kWarps;
  __shared__ __align__(16) float ks[kKeys * LDF];
  __shared__ __align__(16) float vs[kKeys * LDF];
  __shared__ __align__(16) float qs[kMaxGroup * HD];

  const Split sp = split_of_block(seqs, n_kv, ms);
  if (!sp.active) return;
  const PagedRows rows{block_table + int64_t(seqs[sp.seq].table_row) * max_pages, shift, n_kv * HD};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t head_off = int64_t(sp.kvh) * HD;
  const float* qb = q + int64_t(sp.row) * q_stride + int64_t(sp.kvh) * group * HD;
  for (int i = tid; i < group * HD; i += kThreads) qs[i] = qb[i];

  float m[kHeadsPerWarp], l[kHeadsPerWarp], o[kHeadsPerWarp][kPer];
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[i][k] = 0.f;
  }
  for (int k0 = sp.start; k0 < sp.end; k0 += kKeys) {
    __syncthreads();  // the previous keys are no longer read
    for (int c = tid; c < kKeys * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 4, p = k0 + r;
      const bool ok = p < sp.end;
      const int64_t off = ok ? rows.offset(p) + head_off + col : 0;
      cp_async16(ks + r * LDF + col, k_pool + off, ok);
      cp_async16(vs + r * LDF + col, v_pool + off, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      const int hh = warp + kWarps * i;
      if (hh >= group) break;
      const float* qh = qs + hh * HD;
      const float* kr = ks + lane * LDF;
      float s = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 kk = *reinterpret_cast<const float4*>(kr + d);
        const float4 qq = *reinterpret_cast<const float4*>(qh + d);
        s += qq.x * kk.x + qq.y * kk.y + qq.z * kk.z + qq.w * kk.w;
      }
      s = k0 + lane < sp.end ? s * scale_log2 : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(s));  // position k0 is valid: finite
      const float alpha = exp2f(m[i] - mn), p = exp2f(s - mn);
      l[i] = l[i] * alpha + warp_sum(p);
#pragma unroll
      for (int k = 0; k < kPer; ++k) o[i][k] *= alpha;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int k = 0; k < kPer; ++k)
          if (lane + 32 * k < HD) o[i][k] += pj * vs[j * LDF + lane + 32 * k];
      }
      m[i] = mn;
    }
  }
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int hh = warp + kWarps * i;
    if (hh >= group) break;
    const int64_t idx = (int64_t(sp.seq) * n_heads + sp.kvh * group + hh) * ms + sp.split;
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (lane + 32 * k < HD) part_o[idx * HD + lane + 32 * k] = o[i][k];
    if (lane == 0) part_ml[idx] = make_float2(m[i], l[i]);
  }
}

// One warp per (sequence, query head): the splits merged in order.
template <typename T, int HD>
__global__ void decode_merge_kernel(T* out, const float* part_o, const float2* part_ml, const PagedSeq* seqs,
                                    int n_seqs, int n_heads, int ms) {
  constexpr int kPer = (HD + 31) / 32;
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  // launched as pass 1's programmatic dependent, it may start early: wait for pass 1's writes
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (item >= int64_t(n_seqs) * n_heads) return;
  const int si = int(item / n_heads), h = int(item % n_heads);
  const PagedSeq sq = seqs[si];
  const int n = splits_of(sq.first_pos + 1);  // <= kMaxSplits (<= 64): lanes hold splits lane, lane + 32
  const int64_t base = item * ms;
  const float2 a = lane < n ? part_ml[base + lane] : make_float2(-INFINITY, 0.f);
  const float2 b = lane + 32 < n ? part_ml[base + lane + 32] : make_float2(-INFINITY, 0.f);
  const float M = warp_max(fmaxf(a.x, b.x));
  const float wa = lane < n ? exp2f(a.x - M) : 0.f, wb = lane + 32 < n ? exp2f(b.x - M) : 0.f;
  const float L = warp_sum(a.y * wa + b.y * wb);
  float acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = 0.f;
#pragma unroll 4
  for (int s = 0; s < n; ++s) {
    const float wt = __shfl_sync(0xffffffffu, s < 32 ? wa : wb, s & 31);
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (lane + 32 * k < HD) acc[k] += part_o[(base + s) * HD + lane + 32 * k] * wt;
  }
  const float inv = 1.f / L;
  T* ob = out + int64_t(sq.row) * n_heads * HD + int64_t(h) * HD;
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (lane + 32 * k < HD) ob[lane + 32 * k] = from_f32<T>(acc[k] * inv);
}

struct DecodeArgs {
  const PagedSeq* seqs;
  int64_t n_seqs;
  const int32_t* block_table;
  int64_t max_pages, page_size, n_heads, n_kv_heads;
  float scale;
  void* workspace;
  int64_t q_stride;
  const float *k_scale = nullptr, *v_scale = nullptr;  // an fp8 cache's scale pools
};

template <typename T, int HD, bool kSwizzle, bool kL2Prefetch, typename KV, int NT, bool kHalf, bool kV1 = false,
          bool kPK = false>
void launch_tc_kernel(float* part_o, float2* part_ml, const T* q, const KV* k_pool, const KV* v_pool,
                      const DecodeArgs& a, int64_t ms, unsigned blocks, cudaStream_t stream) {
  auto kernel = decode_tc_kernel<T, HD, kSwizzle, kL2Prefetch, KV, NT, kHalf, kV1, kPK>;
  constexpr size_t smem = DecodeSmem<HD, kSwizzle, std::is_same<KV, uint8_t>::value, NT, kV1>::kBytes;
  if (smem > (size_t(48) << 10)) raise_smem_limit(reinterpret_cast<const void*>(kernel), int(smem));
  kernel<<<blocks, kThreads, smem, stream>>>(part_o, part_ml, q, k_pool, v_pool, a.k_scale, a.v_scale, a.seqs,
                                             a.block_table, int(a.max_pages), page_shift(a.page_size),
                                             int(a.n_heads), int(a.n_kv_heads), int(a.n_heads / a.n_kv_heads), int(ms),
                                             a.q_stride, a.scale * 1.4426950408889634f);
  CUDA_CHECK_LAUNCH("decode_tc_kernel");
}

// 32-position rounds (NT = 2), the half A operand, one V tile, K's dims permuted: see the variants.
template <typename T, int HD, typename KV, bool kV1, bool kPK>
void launch_round2(float* part_o, float2* part_ml, const T* q, const KV* k_pool, const KV* v_pool, const DecodeArgs& a,
                   int64_t ms, unsigned blocks, cudaStream_t stream, bool half) {
  if (half)
    launch_tc_kernel<T, HD, true, false, KV, 2, true, kV1, kPK>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks,
                                                                 stream);
  else
    launch_tc_kernel<T, HD, true, false, KV, 2, false, kV1, kPK>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks,
                                                                  stream);
}

// The round (variant bit 3: 2 tiles, 32 positions a warp, on the 4-stage swizzled pipeline; else 1),
// the half A operand (group <= 8, unless bit 4), for the fp8 cache one V T tile (bit 5) and K's head
// dims permuted (bit 6, with bit 3), on the swizzled stages without the L2 hint; the other variants
// keep 16-position rounds on all 16 rows.
template <typename T, int HD, bool kSwizzle, bool kL2Prefetch, typename KV = T>
void launch_tc(float* part_o, float2* part_ml, const T* q, const KV* k_pool, const KV* v_pool, const DecodeArgs& a,
               int64_t ms, unsigned blocks, cudaStream_t stream) {
  constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  const int variant = decode_variant();
  if constexpr (kSwizzle && !kL2Prefetch) {
    const bool half = a.n_heads / a.n_kv_heads <= 8 && !(variant & 16);
    if constexpr (DecodeSmem<HD, kSwizzle, kF8>::kStages >= 4) {
      if (variant & 8) {
        const bool v1 = kF8 && (variant & 32), pk = (variant & 64) != 0;
        if (v1 && pk)
          launch_round2<T, HD, KV, kF8, true>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks, stream, half);
        else if (v1)
          launch_round2<T, HD, KV, kF8, false>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks, stream, half);
        else if (pk)
          launch_round2<T, HD, KV, false, true>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks, stream, half);
        else
          launch_round2<T, HD, KV, false, false>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks, stream, half);
        return;
      }
    }
    if (half)
      launch_tc_kernel<T, HD, true, false, KV, 1, true>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks, stream);
    else
      launch_tc_kernel<T, HD, true, false, KV, 1, false>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks, stream);
  } else {
    launch_tc_kernel<T, HD, kSwizzle, kL2Prefetch, KV, 1, false>(part_o, part_ml, q, k_pool, v_pool, a, ms, blocks,
                                                                stream);
  }
}

template <typename T, int HD, typename KV = T>
void launch_decode(T* out, const T* q, const KV* k_pool, const KV* v_pool, const DecodeArgs& a, cudaStream_t stream) {
  const int64_t ms = max_splits(a.max_pages * a.page_size);
  float* part_o = static_cast<float*>(a.workspace);
  float2* part_ml = reinterpret_cast<float2*>(part_o + a.n_seqs * a.n_heads * ms * HD);
  const int64_t blocks = a.n_seqs * ms * a.n_kv_heads;
  LFM2_CHECK(blocks < (int64_t(1) << 31), "attention_decode_paged: ", blocks, " blocks is too many for one launch");
  const int variant = decode_variant();
  if constexpr (std::is_same<KV, uint8_t>::value) {  // fp8: the swizzled stages (variants 2, 3, 6, 7)
    if (variant & 1)
      launch_tc<T, HD, true, true, KV>(part_o, part_ml, q, k_pool, v_pool, a, ms, unsigned(blocks), stream);
    else
      launch_tc<T, HD, true, false, KV>(part_o, part_ml, q, k_pool, v_pool, a, ms, unsigned(blocks), stream);
  } else if constexpr (std::is_same<T, float>::value) {
    decode_simt_kernel<HD><<<unsigned(blocks), kThreads, 0, stream>>>(
        part_o, part_ml, q, k_pool, v_pool, a.seqs, a.block_table, int(a.max_pages), page_shift(a.page_size),
        int(a.n_heads), int(a.n_kv_heads), int(a.n_heads / a.n_kv_heads), int(ms), a.q_stride,
        a.scale * 1.4426950408889634f);
    CUDA_CHECK_LAUNCH("decode_simt_kernel");
  } else {
    const unsigned grid = unsigned(blocks);
    switch (variant & 3) {
      case 0: launch_tc<T, HD, false, false>(part_o, part_ml, q, k_pool, v_pool, a, ms, grid, stream); break;
      case 1: launch_tc<T, HD, false, true>(part_o, part_ml, q, k_pool, v_pool, a, ms, grid, stream); break;
      case 2: launch_tc<T, HD, true, false>(part_o, part_ml, q, k_pool, v_pool, a, ms, grid, stream); break;
      default: launch_tc<T, HD, true, true>(part_o, part_ml, q, k_pool, v_pool, a, ms, grid, stream);
    }
  }
  launch_pdl(decode_merge_kernel<T, HD>, dim3(grid_for(a.n_seqs * a.n_heads * 32, 256)), dim3(256), 0, stream,
             (variant & 4) != 0, out, static_cast<const float*>(part_o), static_cast<const float2*>(part_ml), a.seqs,
             int(a.n_seqs), int(a.n_heads), int(ms));
  CUDA_CHECK_LAUNCH("decode_merge_kernel");
}

// Both entries, the T cache (KV = T) and the fp8 one (KV = uint8_t, a's scale pools): the arguments
// checked in one line naming the entry, then the kernel for head_dim.
template <typename T, typename KV>
void decode_entry(const char* name, T* out, const T* q, const KV* k_pool, const KV* v_pool, DecodeArgs a,
                  int64_t head_dim, cudaStream_t stream) {
  constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  LFM2_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.n_heads / a.n_kv_heads <= kMaxGroup, name, ": ",
             a.n_heads, " heads over ", a.n_kv_heads, " kv heads (a multiple, at most ", kMaxGroup, " per kv head)");
  LFM2_CHECK(valid_page_size(a.page_size), name, ": page size ", a.page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  LFM2_CHECK(a.max_pages * a.page_size <= (int64_t(1) << 31) && a.n_seqs < (int64_t(1) << 31), name, ": ",
             a.max_pages, " pages of ", a.page_size, ", ", a.n_seqs, " sequences (positions must fit int32)");
  if (a.q_stride == 0) a.q_stride = a.n_heads * head_dim;
  LFM2_CHECK(aligned16(q) && aligned16(k_pool) && aligned16(v_pool) && aligned16(a.workspace) &&
                 (a.q_stride * int64_t(sizeof(T))) % 16 == 0 && (!kF8 || (a.k_scale && a.v_scale)),
             name, ": q, the pools and the workspace must be 16-byte aligned, q rows a multiple of 16 bytes",
             kF8 ? ", the scale pools given" : "");
  if (a.n_seqs == 0) return;
  switch (head_dim) {
    case 16: return launch_decode<T, 16, KV>(out, q, k_pool, v_pool, a, stream);
    case 32: return launch_decode<T, 32, KV>(out, q, k_pool, v_pool, a, stream);
    case 64: return launch_decode<T, 64, KV>(out, q, k_pool, v_pool, a, stream);
    case 128: return launch_decode<T, 128, KV>(out, q, k_pool, v_pool, a, stream);
    default: LFM2_FAIL(name, ": head_dim ", head_dim, " not supported (16, 32, 64 or 128)");
  }
}

}  // namespace

int64_t attention_decode_paged_workspace_bytes(int64_t n_seqs, int64_t n_heads, int64_t head_dim, int64_t max_len) {
  return n_seqs * n_heads * max_splits(max_len) * (head_dim + 2) * int64_t(sizeof(float));
}

template <typename T>
void attention_decode_paged(T* out, const T* q, const T* k_pool, const T* v_pool, const PagedSeq* seqs,
                            int64_t n_seqs, const int32_t* block_table, int64_t max_pages, int64_t page_size,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, void* workspace,
                            cudaStream_t stream, int64_t q_stride) {
  decode_entry("attention_decode_paged", out, q, k_pool, v_pool,
               DecodeArgs{seqs, n_seqs, block_table, max_pages, page_size, n_heads, n_kv_heads, scale, workspace,
                          q_stride},
               head_dim, stream);
}

template <typename T>
void attention_decode_paged_fp8(T* out, const T* q, const uint8_t* k_pool, const uint8_t* v_pool,
                                const float* k_scale, const float* v_scale, const PagedSeq* seqs, int64_t n_seqs,
                                const int32_t* block_table, int64_t max_pages, int64_t page_size, int64_t n_heads,
                                int64_t n_kv_heads, int64_t head_dim, float scale, void* workspace,
                                cudaStream_t stream, int64_t q_stride) {
  DecodeArgs a{seqs, n_seqs, block_table, max_pages, page_size, n_heads, n_kv_heads, scale, workspace, q_stride};
  a.k_scale = k_scale, a.v_scale = v_scale;
  decode_entry("attention_decode_paged_fp8", out, q, k_pool, v_pool, a, head_dim, stream);
}

#define INST(T)                                                                                                   \
  template void attention_decode_paged<T>(T*, const T*, const T*, const T*, const PagedSeq*, int64_t,             \
                                          const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float, void*, \
                                          cudaStream_t, int64_t);
LFM2_FOR_EACH_T(INST)
#undef INST
#define INST(T)                                                                                                   \
  template void attention_decode_paged_fp8<T>(T*, const T*, const uint8_t*, const uint8_t*, const float*,         \
                                              const float*, const PagedSeq*, int64_t, const int32_t*, int64_t,    \
                                              int64_t, int64_t, int64_t, int64_t, float, void*, cudaStream_t, int64_t);
INST(__nv_bfloat16)
INST(__half)
#undef INST

}  // namespace lfm2::cuda
