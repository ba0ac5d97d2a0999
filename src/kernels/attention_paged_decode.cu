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
#include "kernels/attention_mma.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/kv_fp8.cuh"

namespace lfm2::cuda {
namespace {

using namespace mma;

constexpr int kTile = 64, kMinTilesPerSplit = 8, kMaxSplits = 16;
constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kMaxGroup = 16;  // query heads per KV head: rows of one mma A operand

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

// What a pass-1 block works on.
struct Split {
  int seq, kvh, split;  // indices
  int row, start, end;  // q row; positions start .. end - 1
  bool active;
};

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

// kF8: the stages hold e4m3 tiles (kTile rows of HD bytes) and their scales; a T tile of V per tile
// of a round (each warp its own 16 rows; kV1: one, reused by the round's tiles in turn), none of K
// (widened into registers). Before the rounds (16 positions a warp, one V tile): 221-225 us at
// 32 x 10240 on an H100 (splits of 4 tiles), 5 blocks an SM (96 registers, 45 KB). Measured slower
// there: the block widening both into T
// tiles behind a second barrier 226 us; two T tiles pipelined 264; 5 or 6 stages (a 4-tile split in
// flight at once, 4 or 3 blocks an SM) 233 / 250; V widened in place over the warp's own e4m3 rows
// (no T tile, held to 96 registers: spills) 247 at 4 stages, 260 at 5.
template <int HD, bool kSwizzle, bool kF8 = false, int NT = 1, bool kV1 = false>
struct DecodeSmem {
  static constexpr int kStages = kSwizzle && HD < 128 ? 4 : 3;
  static_assert(kStages >= 2 * NT, "a round's tiles and the next round's in flight");
  static constexpr int kTK = kF8 ? 0 : kStages, kTV = kF8 ? (kV1 ? 1 : NT) : kStages;  // T tiles of K, of V
  static constexpr int LQ = HD + 8;                  // Q rows padded: ldmatrix's 8 rows hit 8 bank groups
  static constexpr int LKV = kSwizzle ? HD : HD + 8;  // K/V rows: swizzled, or padded as Q
  static constexpr int kQ = 16 * LQ, kKV = kTile * LKV;
  static constexpr int kF8Tile = kTile * HD;          // bytes of an e4m3 stage (K or V)
  static constexpr size_t kPipe =
      size_t(kQ + (kTK + kTV) * kKV) * 2 + (kF8 ? size_t(2 * kStages) * (kF8Tile + kTile * 4) : 0);
  static constexpr size_t kMerge = size_t(kWarps) * 16 * (HD + 2) * 4;  // per warp: o, max, sum of 16 rows
  static constexpr size_t kBytes = kPipe > kMerge ? kPipe : kMerge;

  // Element offset of 16-byte chunk c of K/V row r. Swizzled: the chunk's place among the 8 of its
  // 128-byte line XOR the row (head_dim >= 64) or the line (smaller heads, several rows a line), so
  // the 8 rows an ldmatrix reads at one chunk fall in 8 distinct bank groups.
  static __device__ __forceinline__ int kv(int r, int c) {
    if constexpr (!kSwizzle) {
      return r * LKV + c * 8;
    } else if constexpr (HD >= 64) {
      return r * HD + (((c & ~7) | ((c & 7) ^ (r & 7))) * 8);
    } else {
      const int u = r * (HD / 8) + c, line = u >> 3;
      return ((line << 3) | ((u & 7) ^ (line & 7))) * 8;
    }
  }
  // Byte offset of 16-byte unit c of e4m3 row r: the unit's place in its 128-byte line XOR the line,
  // so the 8 rows a warp's lanes g = 0..7 read at one unit fall in 8 distinct bank groups.
  static __device__ __forceinline__ int kv8(int r, int c) {
    const int u = r * (HD / 16) + c, line = u >> 3;
    return ((line << 3) | ((u & 7) ^ (line & 7))) * 16;
  }
};

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
  constexpr bool kF8 = std::is_same<KV, uint8_t>::value;
  using S = DecodeSmem<HD, kSwizzle, kF8, NT, kV1>;
  constexpr int LQ = S::LQ, KC = HD / 16, DT = HD / 8, kChunks = HD / 8, kStages = S::kStages;
  constexpr int kC8 = HD / 16;  // 16-byte chunks of an e4m3 row
  // 16-byte chunks of a K / V row (HD * sizeof(KV) bytes); a thread's copies a tile are a trip count
  // known at compile time (the loop unrolled, no remainder loops): the fp8 kernel, bound by
  // instruction issue, 196 -> 188 us at 32 x 10,240 (H100)
  constexpr int kRowChunks = HD * int(sizeof(KV)) / 16, kChunkElems = 16 / int(sizeof(KV));
  constexpr int kCopies = (kTile * kRowChunks + kThreads - 1) / kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sk = reinterpret_cast<T*>(smem_raw);  // [kTK][kTile rows]
  T* sv = sk + S::kTK * S::kKV;            // [kTV][kTile rows]
  T* sq = sv + S::kTV * S::kKV;            // [16][LQ]
  uint8_t* k8 = reinterpret_cast<uint8_t*>(sq + S::kQ);  // fp8: [kStages][kTile][HD] e4m3
  uint8_t* v8 = k8 + kStages * S::kF8Tile;
  float* ks8 = reinterpret_cast<float*>(v8 + kStages * S::kF8Tile);  // fp8: [kStages][kTile] scales
  float* vs8 = ks8 + kStages * kTile;

  const Split sp = split_of_block(seqs, n_kv, ms);
  if (!sp.active) return;
  const PagedRows rows{block_table + int64_t(seqs[sp.seq].table_row) * max_pages, shift, n_kv * HD};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int n_tiles = (sp.end - sp.start + kTile - 1) / kTile;
  const int64_t head_off = int64_t(sp.kvh) * HD;

  const T* qb = q + int64_t(sp.row) * q_stride + int64_t(sp.kvh) * group * HD;
  // kPK: mma k index (chunk kc, k in 0..15) <-> head dim, the same for Q and K, so that lane t4's B
  // fragments of every chunk are head dims t4 HD / 4 .. + HD / 4 - 1 of its row, read at once (one
  // 16-byte load an e4m3 row at head_dim 64) instead of a load a chunk
  auto k_dim = [](int col) {
    const int kc = col / 16, k = col % 16;
    return (HD / 4) * ((k % 8) / 2) + 4 * kc + (k % 2) + 2 * (k / 8);
  };
  // e4m3 row r's bytes t4 HD / 4 .. as HD / 16 words (word kc: head dims 4 kc .. 4 kc + 3 of the lane's)
  auto k_words8 = [&](uint32_t* w, const uint8_t* k8t, int r) {
    if constexpr (HD >= 64) {
#pragma unroll
      for (int u = 0; u < HD / 64; ++u) {
        const uint4 v = *reinterpret_cast<const uint4*>(k8t + S::kv8(r, t4 * (HD / 64) + u));
        w[4 * u] = v.x, w[4 * u + 1] = v.y, w[4 * u + 2] = v.z, w[4 * u + 3] = v.w;
      }
    } else if constexpr (HD == 32) {
      const uint2 v = *reinterpret_cast<const uint2*>(k8t + S::kv8(r, t4 >> 1) + (t4 & 1) * 8);
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(k8t + S::kv8(r, 0) + t4 * 4);
    }
  };
  // T row r's elements t4 HD / 4 .. as HD / 8 words (words 2 kc, 2 kc + 1: the pairs of chunk kc)
  auto k_words = [&](uint32_t* w, const T* kt, int r) {
    if constexpr (HD >= 32) {
#pragma unroll
      for (int u = 0; u < HD / 32; ++u) {
        const uint4 v = *reinterpret_cast<const uint4*>(kt + S::kv(r, t4 * (HD / 32) + u));
        w[4 * u] = v.x, w[4 * u + 1] = v.y, w[4 * u + 2] = v.z, w[4 * u + 3] = v.w;
      }
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(kt + S::kv(r, t4 >> 1) + (t4 & 1) * 4);
      w[0] = v.x, w[1] = v.y;
    }
  };
  if constexpr (kPK) {  // Q's head dims permuted (k_dim below), a pair of T a copy; rows past the group zero
    for (int c = tid; c < 8 * HD; c += kThreads) {
      const int r = c / (HD / 2), col = 2 * (c % (HD / 2));
      const uint32_t v = r < group ? *reinterpret_cast<const uint32_t*>(qb + int64_t(r) * HD + k_dim(col)) : 0u;
      *reinterpret_cast<uint32_t*>(sq + r * LQ + col) = v;
    }
  } else {
    for (int c = tid; c < 16 * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      cp_async16(sq + r * LQ + col, r < group ? qb + int64_t(r) * HD + col : qb, r < group);
    }
  }
  // A tile's copies: copy i of thread tid is chunk c % kRowChunks of row c / kRowChunks, c = tid +
  // i kThreads (a warp's copies whole rows, contiguous); the chunk is the same in every copy, so a
  // thread's sources are the pools from its chunk of the KV head on plus a row's offset (a 32-bit
  // pool row, one widening multiply). Against a 64-bit offset a copy: 11 % fewer instructions in the
  // fp8 kernel, 7 % (fp8 cache) and 5 % (bf16) faster on an H200 (docs/results.md, twentieth session).
  static_assert(kThreads % kRowChunks == 0, "a thread's chunk the same in every copy");
  const int copy_chunk = tid % kRowChunks;
  const KV* k_src = k_pool + head_off + copy_chunk * kChunkElems;
  const KV* v_src = v_pool + head_off + copy_chunk * kChunkElems;
  // A tile (kTile positions from a multiple of kTile) lies on kTile >> shift pages, or on one: lane j
  // of every warp loads the block-table entry of page j of it, a round before the tile's copies, and
  // a copy takes its row's entry by a shuffle (one load a tile instead of one a copy, its latency
  // hidden behind a round; H200: 1-1.5 % faster at 32 x 8,192 on either cache, 4.5 % at 8 x 32,768
  // on the fp8 one, the long-scoreboard stalls 0.67 -> 0.28 cycles an instruction).
  static_assert(kTile == 64, "a tile's pages: kTile >> shift for shift < 6");
  static_assert(kThreads >= kTile, "one thread a scale row");
  const int tile_pages = shift < 6 ? kTile >> shift : 1, slot_mask = (1 << shift) - 1;
  auto tile_entry = [&](int t) {
    int32_t e = 0;
    if (lane < tile_pages) {
      const int p = sp.start + t * kTile + (lane << shift);
      if (p < sp.end) e = rows.table[p >> shift];  // entries past the length are never read
    }
    return e;
  };
  // Row r's pool row in the tile whose entries the lanes hold (an entry not loaded is 0, page 0: a
  // valid address for a copy that reads nothing).
  auto pool_row = [&](int32_t entry, int r, int p) {
    const uint32_t page = uint32_t(__shfl_sync(0xffffffffu, entry, shift < 6 ? r >> shift : 0));
    return (page << shift) | uint32_t(p & slot_mask);
  };
  auto load_tile = [&](int stage, int t, int32_t entry) {
    const int p0 = sp.start + t * kTile;
    KV* dk;
    KV* dv;
    if constexpr (kF8) {
      dk = k8 + stage * S::kF8Tile;
      dv = v8 + stage * S::kF8Tile;
    } else {
      dk = sk + stage * S::kKV;
      dv = sv + stage * S::kKV;
    }
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int c = tid + i * kThreads;
      if (kTile * kRowChunks % kThreads != 0 && c >= kTile * kRowChunks) break;
      const int r = c / kRowChunks, p = p0 + r;
      const bool ok = p < sp.end;
      const int64_t off = int64_t(uint64_t(pool_row(entry, r, p)) * uint32_t(rows.row_elems));
      int d;  // the chunk's place in the stage, in KV elements (bytes of e4m3)
      if constexpr (kF8)
        d = S::kv8(r, copy_chunk);
      else
        d = S::kv(r, copy_chunk);
      if constexpr (kL2Prefetch) {
        cp_async16_l2_256(dk + d, k_src + off, ok);
        cp_async16_l2_256(dv + d, v_src + off, ok);
      } else {
        cp_async16(dk + d, k_src + off, ok);
        cp_async16(dv + d, v_src + off, ok);
      }
    }
    if constexpr (kF8) {
      if (tid < kTile) {  // one scale of K and of V a row (warps 0, 1: a branch for the warp)
        const int r = tid, p = p0 + r;
        const bool ok = p < sp.end;
        const int64_t so = int64_t(uint64_t(pool_row(entry, r, p)) * uint32_t(n_kv)) + sp.kvh;  // (pool row, kv head)
        kv8::cp_async4(ks8 + stage * kTile + r, k_scale + so, ok);
        kv8::cp_async4(vs8 + stage * kTile + r, v_scale + so, ok);
      }
    }
  };
  const int n_round_tiles = (n_tiles + NT - 1) / NT * NT;  // a round's tiles past the split's end zero-filled
#pragma unroll
  for (int s = 0; s < kStages - NT; ++s) {
    if (s < n_round_tiles) load_tile(s, s, tile_entry(s));
    cp_async_commit();  // empty groups keep the count uniform
  }
  int32_t entries[NT];  // the entries of the tiles the next round copies
#pragma unroll
  for (int i = 0; i < NT; ++i) entries[i] = tile_entry(kStages - NT + i);

  uint32_t qf[KC][4];
  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  // Round t / NT: tiles t .. t + NT - 1, this warp's 16 positions of each (16 NT positions) scored
  // as one: one max, rescale and exp round, then P V. kHalf (group <= 8): A rows 8..15 hold no query
  // head, so their max, exp, sum and rescale are skipped and their P is 0 (the live rows' bits are
  // the same either way).
  auto attend = [&](int t) {
    const int kw = sp.start + t * kTile + 16 * warp;  // this warp's first position of the round
    if (kw >= sp.end) return;
    const int mi = lane >> 3;
    // fp8: V rows 16 warp .. + 15 of tile t + i -> T tile dst (the warp's own rows)
    auto widen_v = [&](int i, T* dst) {
      const int st = (t + i) % kStages;
      const uint8_t* v8t = v8 + st * S::kF8Tile;
      for (int c = lane; c < 16 * kC8; c += 32) {
        const int r = 16 * warp + c / kC8, ch = c % kC8;
        const uint4 bv = *reinterpret_cast<const uint4*>(v8t + S::kv8(r, ch));
        kv8::widen16<T>(dst + S::kv(r, 2 * ch), dst + S::kv(r, 2 * ch + 1), bv, vs8[st * kTile + r]);
      }
    };
    if constexpr (kF8) {  // the warp's ldmatrix of the last round is done; kV1: tile t's V only, t + 1's after its P V
      __syncwarp();
#pragma unroll
      for (int i = 0; i < S::kTV; ++i) widen_v(i, sv + i * S::kKV);
    }
    float sc[NT][2][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int st = (t + i) % kStages;
#pragma unroll
      for (int j = 0; j < 2; ++j) sc[i][j][0] = sc[i][j][1] = sc[i][j][2] = sc[i][j][3] = 0.f;
      if constexpr (kPK) {  // the lane's HD / 4 head dims of rows g, 8 + g: words kc of k_dim's order
        uint32_t w[2][kF8 ? KC : 2 * KC];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = 16 * warp + 8 * j + g;
          if constexpr (kF8)
            k_words8(w[j], k8 + st * S::kF8Tile, r);
          else
            k_words(w[j], sk + st * S::kKV, r);
        }
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
          uint32_t b[4];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            if constexpr (kF8) {
              const float s = ks8[st * kTile + 16 * warp + 8 * j + g];
              b[2 * j] = kv8::widen2<T>(w[j][kc], s);
              b[2 * j + 1] = kv8::widen2<T>(w[j][kc] >> 16, s);
            } else {
              b[2 * j] = w[j][2 * kc];
              b[2 * j + 1] = w[j][2 * kc + 1];
            }
          }
          mma16816<T>(sc[i][0], qf[kc], b[0], b[1]);
          mma16816<T>(sc[i][1], qf[kc], b[2], b[3]);
        }
      } else {
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
          uint32_t b[4];
          if constexpr (kF8) {  // b as ldmatrix_x4 below gives it: rows g, 8 + g; pairs t4, 4 + t4 of unit kc
            const uint8_t* k8t = k8 + st * S::kF8Tile;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int r = 16 * warp + 8 * j + g;
              const uint4 u = *reinterpret_cast<const uint4*>(k8t + S::kv8(r, kc));
              const float s = ks8[st * kTile + r];
              const int sh = 16 * (t4 & 1);
              b[2 * j] = kv8::widen2<T>((t4 & 2 ? u.y : u.x) >> sh, s);
              b[2 * j + 1] = kv8::widen2<T>((t4 & 2 ? u.w : u.z) >> sh, s);
            }
          } else {
            ldmatrix_x4(b, sk + st * S::kKV + S::kv(16 * warp + (mi >> 1) * 8 + (lane & 7), kc * 2 + (mi & 1)));
          }
          mma16816<T>(sc[i][0], qf[kc], b[0], b[1]);
          mma16816<T>(sc[i][1], qf[kc], b[2], b[3]);
        }
      }
    }
    float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = kw + i * kTile + j * 8 + 2 * t4 + e < sp.end;
          sc[i][j][e] = ok ? sc[i][j][e] * scale_log2 : -INFINITY;
          tmax0 = fmaxf(tmax0, sc[i][j][e]);
          if constexpr (!kHalf) {
            sc[i][j][2 + e] = ok ? sc[i][j][2 + e] * scale_log2 : -INFINITY;
            tmax1 = fmaxf(tmax1, sc[i][j][2 + e]);
          }
        }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, o2));
      if constexpr (!kHalf) tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, o2));
    }
    // position kw is valid, so every row's new max is finite
    const float mn0 = fmaxf(m0, tmax0), alpha0 = exp2f(m0 - mn0);
    m0 = mn0;
    l0 *= alpha0;
    float mn1 = 0.f, alpha1 = 0.f;
    if constexpr (!kHalf) {
      mn1 = fmaxf(m1, tmax1), alpha1 = exp2f(m1 - mn1);
      m1 = mn1;
      l1 *= alpha1;
    }
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      o[j][0] *= alpha0;
      o[j][1] *= alpha0;
      if constexpr (!kHalf) {
        o[j][2] *= alpha1;
        o[j][3] *= alpha1;
      }
    }
    uint32_t pa[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      float p[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        p[j][0] = exp2f(sc[i][j][0] - mn0);
        p[j][1] = exp2f(sc[i][j][1] - mn0);
        l0 += p[j][0] + p[j][1];
        if constexpr (!kHalf) {
          p[j][2] = exp2f(sc[i][j][2] - mn1);
          p[j][3] = exp2f(sc[i][j][3] - mn1);
          l1 += p[j][2] + p[j][3];
        }
      }
      pa[i][0] = pack2<T>(p[0][0], p[0][1]);
      pa[i][2] = pack2<T>(p[1][0], p[1][1]);
      pa[i][1] = kHalf ? 0u : pack2<T>(p[0][2], p[0][3]);
      pa[i][3] = kHalf ? 0u : pack2<T>(p[1][2], p[1][3]);
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      if constexpr (kF8) {
        if (kV1 && i > 0) {  // tile t + i - 1's ldmatrix done: its rows rewritten with tile t + i's
          __syncwarp();
          widen_v(i, sv);
        }
        __syncwarp();  // the warp's V rows written
      }
      const T* vs = sv + (kF8 ? (kV1 ? 0 : i) : (t + i) % kStages) * S::kKV;
#pragma unroll
      for (int d = 0; d < DT; d += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs + S::kv(16 * warp + (mi & 1) * 8 + (lane & 7), d + (mi >> 1)));
        mma16816<T>(o[d], pa[i], b[0], b[1]);
        mma16816<T>(o[d + 1], pa[i], b[2], b[3]);
      }
    }
  };
  // rounds of NT tiles; the stages of round r - 1's tiles are refilled in round r
  for (int t = 0; t < n_round_tiles; t += NT) {
    cp_async_wait<kStages - 2 * NT>();  // tiles t .. t + NT - 1 (and the Q rows) landed
    __syncthreads();                    // ... for every thread; the last round's stages are free
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int tl = t + kStages - NT + i;
      if (tl < n_round_tiles) load_tile(tl % kStages, tl, entries[i]);
      cp_async_commit();
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) entries[i] = tile_entry(t + kStages + i);  // the next round's tiles
    if (t == 0) {
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) ldmatrix_x4(qf[kc], sq + (lane & 15) * LQ + kc * 16 + (lane >> 4) * 8);
    }
    attend(t);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  __syncthreads();  // the stages are no longer read: the merge reuses them
  float* mo = reinterpret_cast<float*>(smem_raw);  // [kWarps][16][HD]
  float* mm = mo + kWarps * 16 * HD;               // [kWarps][16] max
  float* ml = mm + kWarps * 16;                    // [kWarps][16] sum
  const int r0 = warp * 16 + g;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int col = j * 8 + 2 * t4;
    mo[r0 * HD + col] = o[j][0];
    mo[r0 * HD + col + 1] = o[j][1];
    mo[(r0 + 8) * HD + col] = o[j][2];
    mo[(r0 + 8) * HD + col + 1] = o[j][3];
  }
  if (t4 == 0) {
    mm[r0] = m0, ml[r0] = l0;
    mm[r0 + 8] = m1, ml[r0 + 8] = l1;
  }
  __syncthreads();
  // warps in order; a warp that saw no position has max -inf, weight 0 and o = l = 0
  for (int i = tid; i < group * HD; i += kThreads) {
    const int r = i / HD, d = i - r * HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, mm[w * 16 + r]);
    float O = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = exp2f(mm[w * 16 + r] - M);
      O += mo[(w * 16 + r) * HD + d] * wt;
      L += ml[w * 16 + r] * wt;
    }
    const int64_t idx = (int64_t(sp.seq) * n_heads + sp.kvh * group + r) * ms + sp.split;
    part_o[idx * HD + d] = O;
    if (d == 0) part_ml[idx] = make_float2(M, L);
  }
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
