// The expert products of the decode MoE (moe_experts_decode.cu): a persistent grouped GEMM for a
// few rows per expert that streams each touched expert's weights once through a multi-stage
// cp.async pipeline in shared memory.
//
// Work: the touched experts (offsets[e + 1] > offsets[e], ascending) times their row tiles are
// `units`; block b takes units [U b / G, U (b + 1) / G), so every block streams the same number of
// weight bytes (+-1 unit) whatever the routing. A unit is kBM weight rows of one expert:
//   gate/up: 64 output features j, i.e. w13 rows j (gate) and I + j (up); act = silu(g) * u (T)
//   down:    128 output features h of w2; y (fp32)
// over all k, in passes of kTB of the expert's tokens (rows of `in` by src_token, or the expert's
// contiguous act rows). The block's stages (unit, pass, 64-k step) form one sequence that the
// pipeline walks S - 1 stages ahead, across units, so the weight stream never drains between units.
//
// A stage in shared memory: the kBM x 64 weight tile and the kTB x 64 token tile, 128-byte rows with
// the 16-byte chunks XOR-swizzled by row (conflict-free ldmatrix and cp.async). 8 warps: warp
// (rg = w % 4, th = w / 4) multiplies weight rows [32 rg, +32) (two m16 tiles: gate/up, the gate and
// up rows of the same 16 j) by the token n8 tiles th, th + 2, th + 4, th + 6 (only those with live
// tokens: the two halves share the work of any token count), mma.sync m16n8k16 with fp32
// accumulators: swap-AB, the weights are the A operand (MmaConsumer; the kernel's Consumer argument
// may instead be moe_decode_wgmma.cuh's WgmmaConsumer, Hopper's wgmma on the same stages). Weight
// loads may carry an L2 evict-first hint and token loads evict-last (Args::l2_hints), so the
// streamed weights do not push the tokens (read once per unit) out of L2.
//
// Exactness: an output element (feature, token) is the sum over 64-k stages in ascending k, each
// four mma steps of 16 k in order, from that feature's weight row and that token's row alone; which
// block, unit, pass, slot or warp computes it never changes its arithmetic. A row's bits therefore
// depend on its own input and experts only (not on n_tokens, the other rows, or the grid).
//
// Programmatic dependent launch: the fused router lets gate/up launch once its logits are read;
// gate/up waits for the router before reading offsets and lets its dependent (down) launch once it
// has them; down reads offsets (finished two grids back), issues its first weight stages, and only
// then waits for gate/up's act; it lets the combine launch at its end.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gemv_mma.cuh"

namespace lfm2::cuda::moe_gemm {

constexpr int kBM = 128;  // weight rows per unit
constexpr int kBK = 64;   // k per stage
constexpr int kTB = 64;   // token slots per pass
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowBytes = kBK * 2;         // one 64-k row of 16-bit elements
constexpr int kTileW = kBM * kRowBytes;    // 16 KB
constexpr int kTileX = kTB * kRowBytes;    // 8 KB
constexpr int kStageBytes = kTileW + kTileX;

constexpr int kMaxExperts = 1024;

// Dynamic shared memory of a block: S stages, then offsets (E + 1), the touched list (E) and the
// items' prefix (E + 1) as ints, sized for kMaxExperts so that a kernel's size never changes
// (raise_smem_limit keys on it), then UnitRing's ring; `pad` bytes more where the stages' base must
// be aligned past the dynamic memory's own alignment (the wgmma consumer: 1024, moe_decode_wgmma.cuh).
constexpr int kIndexInts = 3 * kMaxExperts + 8;  // the three arrays; UnitRing's ring after them
constexpr int kRingInts = 32;
constexpr int smem_bytes(int stages, int pad = 0) { return stages * kStageBytes + (kIndexInts + kRingInts) * 4 + pad; }

struct Args {
  const void* w;             // (E, rows, K): gate/up w13 (rows 2 R), down w2 (rows R)
  const void* x;             // gate/up: in (n_tokens, K); down: act (P, K)
  const int32_t* offsets;    // (E + 1), each expert's first permuted row
  const int32_t* src_token;  // (P), the token of each permuted row (gate/up)
  void* out;                 // gate/up: act (P, R) T; down: y (P, R) fp32
  int64_t K, R;              // k; output features (gate/up: I, down: H)
  int n_experts;
  int l2_hints;              // 1: weights evict-first, tokens evict-last in L2; 0: no hints
  int items;                 // 1: blocks share (unit, pass) items, not units (see item_of)
  // units (or items) taken from ctr[0] as blocks free up (UnitRing), not a fixed share per block;
  // ctr[1] counts the blocks done, and the last one zeroes both (zero before the first launch, so
  // between launches: launches sharing them must be stream-ordered). Null: fixed shares.
  int* ctr = nullptr;
  // gate/up with taken units: bytes at the start of each weight row of the block's likely first unit
  // fetched into L2 before the grid wait (prefetch_first_unit; speed only, 0: none)
  int spec_bytes = 0;
};

// Both products in one grid (moe_decode_fused.cuh).
struct FusedArgs {
  Args up, down;  // gate/up's and down's; up.ctr: the pair both take their units from and count blocks in
  int* ready;     // (n_experts) gate/up units stored per expert; zero between launches (the last block zeroes it)
  // 1: a block's first unit is unit blockIdx.x (gate/up's prefetched first unit, as moe_gemm_kernel's),
  // the rest from the counter; 0: every unit from the counter (moe_decode_fused.cuh: why)
  int first_by_block = 0;
};

__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void griddep_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// The touched experts, ascending (offsets[e + 1] > offsets[e]): s_off (n_experts + 1) copied from
// offsets (the router's, finished before gate/up's grid wait returns and before down starts),
// s_touched[0, s_count) the experts with rows. Every thread of the block calls it (two barriers).
__device__ __forceinline__ void load_touched(const int32_t* offsets, int n_experts, int* s_off, int* s_touched,
                                             int& s_count) {
  for (int i = threadIdx.x; i <= n_experts; i += blockDim.x) s_off[i] = __ldcg(offsets + i);
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int run = 0;
    for (int b = 0; b < n_experts; b += 32) {
      const int e = b + lane;
      const bool used = e < n_experts && s_off[e + 1] > s_off[e];
      const unsigned m = __ballot_sync(0xffffffffu, used);
      if (used) s_touched[run + __popc(m & ((1u << lane) - 1u))] = e;
      run += __popc(m);
    }
    if (lane == 0) s_count = run;
  }
  __syncthreads();
}

// gate/up, units taken from the counter: block b's first unit is unit b, which is (expert b / tiles,
// tile b % tiles) whenever the experts before it are all touched (a decode batch of 32 tokens at
// top-4 of 32 touches ~31; 256 tokens all). While the router still runs (this grid launched as its
// dependent), the first spec_bytes of that unit's 128 weight rows - its first stages - are fetched
// into L2 (cp.async.bulk.prefetch, one per row), so the weight stream starts from L2 once the wait
// returns. A wrong guess (an untouched expert before) only fetches bytes that go unused.
// w: (n_experts, 2 R, row_bytes) gate/up weights; every thread of the block calls it.
__device__ __forceinline__ void prefetch_first_unit(const void* w, int64_t row_bytes, int64_t R, int n_experts,
                                                    int bytes) {
  const int64_t tiles = (R + 63) / 64, e = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const int r = threadIdx.x;
  const int64_t f = tile * 64 + (r & 63);
  if (r >= 128 || e >= n_experts || f >= R) return;
  const int64_t row = e * 2 * R + (r >> 6) * R + f;  // gate rows, then the up rows of the same j
  const uint32_t n = uint32_t(min(int64_t(bytes), row_bytes)) & ~15u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (n)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(static_cast<const char*>(w) + row * row_bytes),
                 "r"(n)
                 : "memory");
#else
  (void)w, (void)n;  // the bulk prefetch is sm_90's
#endif
}

// gate/up's start: its likely first unit into L2 (taken units, not items), then the wait for the router.
template <typename T>
__device__ __forceinline__ void gate_up_wait(const Args& a) {
  if (a.spec_bytes > 0 && a.ctr != nullptr && !a.items)
    prefetch_first_unit(a.w, a.K * int64_t(sizeof(T)), a.R, a.n_experts, a.spec_bytes);
  griddep_wait();
}

// 16 bytes global -> shared (zeros when !live; src must still be a valid address) under an L2
// cache policy. Weights hint a 256-byte L2 fetch: a row's next stage then comes from L2.
template <bool kWeight>
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool live, uint64_t policy) {
  if constexpr (kWeight)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(live ? 16 : 0), "l"(policy)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(live ? 16 : 0), "l"(policy)
                 : "memory");
}
// The L2 policies of the weight and the token loads.
__device__ __forceinline__ void l2_policies(bool hints, uint64_t& w, uint64_t& x) {
  if (hints) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(w));
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(x));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(w));
    x = w;
  }
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * kRowBytes + ((c ^ (r & 7)) << 4)); }

struct Unit {
  int e, begin, n_e, passes;
  int64_t tile;
  int pass0 = 0;  // the first pass (items: the item's pass, passes = 1)
};

__device__ __forceinline__ Unit unit_of(int64_t u, int64_t tiles, const int* s_touched, const int* s_off) {
  Unit un;
  const int64_t i = u / tiles;
  un.tile = u - i * tiles;
  un.e = s_touched[i];
  un.begin = s_off[un.e];
  un.n_e = s_off[un.e + 1] - un.begin;
  un.passes = (un.n_e + kTB - 1) / kTB;
  return un;
}

// Where a block's producer (issuing stages) or consumer (multiplying them) stands in its walk over
// (unit, pass, 64-k step), in that order.
struct StageWalk {
  int64_t u;
  Unit un;
  int pass = 0, k = 0;
};

// The producer's first S - 1 stages, each one cp.async group (empty past the block's last unit).
// load(slot, k, weights, tokens) issues a stage's parts, advance() moves the producer one stage on.
// Down issues the weight part of its first stages before it waits for gate/up (the weights do not
// depend on it), then the token part.
template <bool kGateUp, int S, class Load, class Advance>
__device__ __forceinline__ void fill_pipeline(const StageWalk& pw, int64_t end, int nk, Load&& load,
                                              Advance&& advance) {
  int pre = 0;
  if constexpr (!kGateUp) {
    pre = min(S - 1, nk);
    for (int s = 0; s < pre; ++s) load(s, s, true, false);
    griddep_wait();
  }
  for (int s = 0; s < S - 1; ++s) {
    if (pw.u < end) load(s, pw.k, s >= pre, true);
    commit();
    if (pw.u < end) advance();
  }
}

// The producer's stage in the main loop: slot refilled (a cp.async group, empty past the block's last
// unit) and the producer one stage on; the slot after it.
template <int S, class Load, class Advance>
__device__ __forceinline__ int refill_stage(const StageWalk& pw, int64_t end, int slot, Load&& load,
                                           Advance&& advance) {
  if (pw.u < end) load(slot, pw.k, true, true);
  commit();
  if (pw.u < end) advance();
  return slot + 1 == S ? 0 : slot + 1;
}

// Items (Args::items): every (unit, pass) is a work item, so that an expert crowded past kTB rows
// (several passes over each of its units) spreads over more blocks instead of lengthening the few
// that hold its units. s_cum[i]: the items of the touched experts before the i-th (tiles x passes
// each), in order expert, tile, pass (a tile's passes back to back: its weights again from L2).
// hint: the touched index of the previous lookup (items are visited in ascending order).
__device__ __forceinline__ Unit item_of(int64_t w, int64_t tiles, const int* s_touched, const int* s_off,
                                       const int* s_cum, int& hint) {
  while (s_cum[hint + 1] <= w) ++hint;
  Unit un;
  un.e = s_touched[hint];
  un.begin = s_off[un.e];
  un.n_e = s_off[un.e + 1] - un.begin;
  const int64_t passes = (un.n_e + kTB - 1) / kTB, local = w - s_cum[hint];
  un.tile = local / passes;
  un.pass0 = int(local - un.tile * passes);
  un.passes = 1;
  return un;
}

// The producer side of one thread: which global rows its cp.async copies read for the current
// (unit, pass). Thread t copies chunk t % 8 of weight rows t / 8 + 32 i (i < 4) and of token rows
// t / 8 + 32 i (i < 2). gate/up's tile rows: in each 32-row slab, 16 gate rows j then the up rows
// of the same 16 j (kPairs8 = false: mma.sync's two m16 tiles), or in each 16-row slab 8 gate rows
// then the up rows of the same 8 j (kPairs8: a wgmma thread's accumulator rows g and g + 8).
template <typename T, bool kGateUp, bool kPairs8 = false>
struct Feeder {
  const T* w[4];   // weight rows (nullptr: past the end, zeros)
  const T* x[2];   // token rows (nullptr: no token, zeros)
  bool fill[2];    // whether the token row is written at all (rows of n8 tiles with live tokens)
  uint64_t pol_w, pol_x;  // L2 policies

  __device__ __forceinline__ void set_unit(const Args& a, const Unit& un) {
    const T* we = static_cast<const T*>(a.w) + int64_t(un.e) * (kGateUp ? 2 : 1) * a.R * a.K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      int64_t f, row;
      if constexpr (kGateUp && kPairs8) {
        f = un.tile * 64 + 8 * (r >> 4) + (r & 7);
        row = ((r >> 3) & 1) * a.R + f;
      } else if constexpr (kGateUp) {
        f = un.tile * 64 + 16 * (r >> 5) + (r & 15);
        row = ((r >> 4) & 1) * a.R + f;
      } else {
        f = un.tile * kBM + r;
        row = f;
      }
      w[i] = f < a.R ? we + row * a.K : nullptr;
    }
  }
  __device__ __forceinline__ void set_pass(const Args& a, const Unit& un, int pass) {
    const int live = min(kTB, un.n_e - pass * kTB), rows = (live + 7) & ~7;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int n = (threadIdx.x >> 3) + 32 * i, slot = un.begin + pass * kTB + n;
      fill[i] = n < rows;
      x[i] = nullptr;
      if (n < live) {
        const int64_t src = kGateUp ? int64_t(__ldcg(a.src_token + slot)) : int64_t(slot);
        x[i] = static_cast<const T*>(a.x) + src * a.K;
      }
    }
  }
  __device__ __forceinline__ void load_w(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 8 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = (threadIdx.x >> 3) + 32 * i;
      const bool live = kin && w[i] != nullptr;
      cp16<true>(stage + swz(r, c), live ? static_cast<const void*>(w[i] + k) : a.w, live, pol_w);
    }
  }
  __device__ __forceinline__ void load_x(const Args& a, uint32_t stage, int ks) const {
    const int c = threadIdx.x & 7;
    const int64_t k = int64_t(ks) * kBK + 8 * c;
    const bool kin = k < a.K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!fill[i]) continue;
      const int n = (threadIdx.x >> 3) + 32 * i;
      const bool live = kin && x[i] != nullptr;
      cp16<false>(stage + kTileW + swz(n, c), live ? static_cast<const void*>(x[i] + k) : a.x, live, pol_x);
    }
  }
};

// The warp's n8 tiles (2 t + th, t < 4) that hold live tokens in pass `pass` of `un`: t < result.
__device__ __forceinline__ int live_tiles(const Unit& un, int pass, int th) {
  const int tiles = (min(kTB, un.n_e - pass * kTB) + 7) / 8;
  return max(0, min(4, (tiles - th + 1) / 2));
}

// acc[m][t] += W[rows 32 rg + 16 m, +16) . X[tokens 8 (2 t + th), +8) over the stage's 64 k, t < nt.
template <typename T>
__device__ __forceinline__ void stage_mma(float (&acc)[2][4][4], uint32_t stage, int rg, int th, int nt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t af[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int row = 32 * rg + 16 * m + (lane & 7) + 8 * ((lane >> 3) & 1);
      ldsm_x4(af[m], stage + swz(row, 2 * kk + (lane >> 4)));
    }
    uint32_t bf[4][2];
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      if (2 * np < nt) {
        // lanes 0-15: tile 2 (2 np) + th, lanes 16-31: tile 2 (2 np + 1) + th
        const int tok = 8 * (4 * np + th + 2 * (lane >> 4)) + (lane & 7);
        uint32_t r[4];
        ldsm_x4(r, stage + kTileW + swz(tok, 2 * kk + ((lane >> 3) & 1)));
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (t < nt) {
#pragma unroll
        for (int m = 0; m < 2; ++m)
          gemv::mma16816<T>(acc[m][t], af[m][0], af[m][1], af[m][2], af[m][3], bf[t][0], bf[t][1]);
      }
    }
  }
}

// The end of a (unit, pass): the warp's accumulators to act (gate/up, SwiGLU) or y (down); zeroed.
template <typename T, bool kGateUp>
__device__ __forceinline__ void store_tile(const Args& a, float (&acc)[2][4][4], const Unit& un, int pass, int rg,
                                           int th, int nt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    if (t < nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int slot = pass * kTB + 8 * (2 * t + th) + gemv::acc_col(lane, c);
        if (slot >= un.n_e) continue;
        const int64_t row = un.begin + slot;
        if constexpr (kGateUp) {
          const int64_t j = un.tile * 64 + 16 * rg + gemv::acc_row(lane, c);
          const float g = acc[0][t][c];
          if (j < a.R) static_cast<T*>(a.out)[row * a.R + j] = from_f32<T>(g / (1.0f + expf(-g)) * acc[1][t][c]);
        } else {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const int64_t h = un.tile * kBM + 32 * rg + 16 * m + gemv::acc_row(lane, c);
            if (h < a.R) static_cast<float*>(a.out)[row * a.R + h] = acc[m][t][c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][t][c] = 0.f;
}

// Units taken from a counter as blocks free up (Args::ctr, moe_gemm_fp8::Args::ctr): unit blockIdx.x
// first, then one from the counter each time the producer starts a unit, asked for one unit ahead
// (thread 0 never waits on the atomic) and kept in ring[i % 32] for the consumer (at most S - 1 <
// 32 units behind). A unit's arithmetic never depends on the block that takes it. producer_next:
// every thread (a barrier); consumer_next: the unit the producer took i-th, for the consumer's i-th.
struct UnitRing {
  int* ctr;
  int* ring;
  int first;  // the unit of counter value 0: gridDim.x (unit blockIdx.x is the block's first), or 0
  int ahead = 0;  // thread 0: the counter's value for the next unit (raw)
  int pi = 0, ci = 0;  // the producer's and the consumer's unit counts

  __device__ __forceinline__ UnitRing(int* counter, int* ring32, int first_unit = int(gridDim.x))
      : ctr(counter), ring(ring32), first(first_unit) {
    if (ctr && threadIdx.x == 0) ahead = atomicAdd(ctr, 1);
  }
  __device__ __forceinline__ int64_t producer_next() {
    ++pi;
    if (threadIdx.x == 0) {
      ring[pi & 31] = first + ahead;
      ahead = atomicAdd(ctr, 1);
    }
    __syncthreads();
    return ring[pi & 31];
  }
  __device__ __forceinline__ int64_t consumer_next() { return ring[++ci & 31]; }
};

// A block done taking units from ctr[0]: counted in ctr[1]; the last block zeroes both for the next
// launch (every block's last take precedes its count: thread 0 made both, with a fence between),
// and the n_ready ints of ready (moe_decode_fused.cuh's per-expert counts; none by default).
__device__ __forceinline__ void release_counter(int* ctr, int* ready = nullptr, int n_ready = 0) {
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(ctr + 1, 1) == int(gridDim.x) - 1) {
    for (int e = 0; e < n_ready; ++e) ready[e] = 0;
    atomicExch(ctr, 0);
    atomicExch(ctr + 1, 0);
  }
}

// The consumer of the stages with mma.sync (kernel's Consumer; moe_decode_wgmma.cuh has the
// wgmma one): warp (rg, th)'s accumulators over the live n8 token tiles of the pass.
template <typename T, bool kGateUp>
struct MmaConsumer {
  static constexpr bool kAsyncProxy = false;  // the stages are read by ldmatrix (generic proxy)
  static constexpr bool kPairs8 = false;      // Feeder's gate/up row order
  static constexpr int kPad = 0;              // smem_bytes' pad: the dynamic base's 128 bytes suffice
  float acc[2][4][4];
  int rg, th, nt = 0;

  __device__ __forceinline__ MmaConsumer() : acc{}, rg((threadIdx.x >> 5) & 3), th(threadIdx.x >> 7) {}

  __device__ __forceinline__ void begin(const Unit& un, int pass) { nt = live_tiles(un, pass, th); }
  __device__ __forceinline__ void stage(uint32_t s) {
    if (nt > 0) stage_mma<T>(acc, s, rg, th, nt);
  }
  __device__ __forceinline__ void store(const Args& a, const Unit& un, int pass) {
    if (nt > 0) store_tile<T, kGateUp>(a, acc, un, pass, rg, th, nt);
  }
};

// s_cum (count + 1): an exclusive scan of tiles x passes over the touched experts, the items before
// each (Args::items); warp 0 scans, then the block's barrier.
__device__ __forceinline__ void scan_items(int* s_cum, const int* s_touched, const int* s_off, int count, int tiles) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int run = 0;
    for (int b = 0; b < count; b += 32) {
      const int i = b + lane;
      int v = 0;
      if (i < count) {
        const int e = s_touched[i];
        v = tiles * ((s_off[e + 1] - s_off[e] + kTB - 1) / kTB);
      }
      int incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
      }
      if (i < count) s_cum[i] = run + incl - v;
      run += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) s_cum[count] = run;
  }
  __syncthreads();
}

// The stages' base in dynamic shared memory, aligned to kPad as the consumer needs (smem_bytes'
// pad leaves room for it).
template <int kPad>
__device__ __forceinline__ unsigned char* stages_base(unsigned char* raw) {
  if constexpr (kPad > 0) raw += (kPad - (uint32_t(__cvta_generic_to_shared(raw)) & (kPad - 1))) & (kPad - 1);
  return raw;
}

// What a block of moe_gemm_kernel works on: the touched experts' units (or items) in ascending
// order, fixed, [units b / grid, units (b + 1) / grid), or taken (a.ctr) from UnitRing's counter, so
// that a crowded expert's passes or a slow SM delay no block's share; `first` is the block's first.
struct BlockUnits {
  const int *touched, *off, *cum;
  int64_t tiles, end, first;
  bool items, taken;
  __device__ __forceinline__ Unit at(int64_t u, int& hint) const {
    return items ? item_of(u, tiles, touched, off, cum, hint) : unit_of(u, tiles, touched, off);
  }
};

// Every thread of the block calls it (the items' scan synchronises).
__device__ __forceinline__ BlockUnits block_units(const Args& a, bool gate_up, const int* touched, const int* off,
                                                  int* cum, int count) {
  BlockUnits b{touched, off, cum};
  b.tiles = gate_up ? (a.R + 63) / 64 : (a.R + kBM - 1) / kBM;
  b.items = a.items != 0;
  if (b.items) scan_items(cum, touched, off, count, int(b.tiles));
  const int64_t units = b.items ? int64_t(cum[count]) : int64_t(count) * b.tiles;
  b.taken = a.ctr != nullptr;
  b.end = b.taken ? units : units * (blockIdx.x + 1) / gridDim.x;
  b.first = b.taken ? int64_t(blockIdx.x) : units * blockIdx.x / gridDim.x;
  return b;
}

template <typename T, bool kGateUp, int S, typename Consumer = MmaConsumer<T, kGateUp>>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_kernel(const Args a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int s_count;
  unsigned char* smem = stages_base<Consumer::kPad>(smem_raw);
  int* s_off = reinterpret_cast<int*>(smem + S * kStageBytes);
  int* s_touched = s_off + a.n_experts + 1;
  int* s_cum = s_touched + a.n_experts;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));

  if constexpr (kGateUp) gate_up_wait<T>(a);
  load_touched(a.offsets, a.n_experts, s_off, s_touched, s_count);
  if constexpr (kGateUp) griddep_launch();

  const BlockUnits U = block_units(a, kGateUp, s_touched, s_off, s_cum, s_count);
  const int64_t u_end = U.end;
  UnitRing ring(a.ctr, s_off + kIndexInts);
  if (U.first >= u_end) {
    // down still waits: its grid must not finish before gate/up's (kernels after it rely on that)
    if constexpr (!kGateUp) griddep_wait();
    if (U.taken) release_counter(a.ctr);
    return;
  }
  const int nk = int((a.K + kBK - 1) / kBK);
  int p_hint = 0, c_hint = 0;  // item_of's hints: producer, consumer

  Feeder<T, kGateUp, Consumer::kPairs8> feed;
  l2_policies(a.l2_hints != 0, feed.pol_w, feed.pol_x);
  StageWalk pw{U.first, U.at(U.first, p_hint)};  // the producer's
  feed.set_unit(a, pw.un);
  feed.set_pass(a, pw.un, pw.un.pass0);
  auto load = [&](int slot, int k, bool w, bool x) {
    if (w) feed.load_w(a, base + slot * kStageBytes, k);
    if (x) feed.load_x(a, base + slot * kStageBytes, k);
  };
  auto advance = [&]() {  // the producer one stage on
    if (++pw.k < nk) return;
    pw.k = 0;
    if (++pw.pass >= pw.un.passes) {
      pw.pass = 0;
      pw.u = U.taken ? ring.producer_next() : pw.u + 1;
      if (pw.u >= u_end) return;
      pw.un = U.at(pw.u, p_hint);
      feed.set_unit(a, pw.un);
    }
    feed.set_pass(a, pw.un, pw.un.pass0 + pw.pass);
  };
  fill_pipeline<kGateUp, S>(pw, u_end, nk, load, advance);

  StageWalk cw{U.first, U.at(U.first, c_hint)};  // the consumer's, from the block's first unit
  Consumer con;
  con.begin(cw.un, cw.un.pass0);
  int slot_c = 0, slot_p = S - 1;
  while (cw.u < u_end) {
    wait_pending<S - 2>();  // this thread's copies of stage slot_c have landed
    // (wgmma reads them through the async proxy: this thread's writes are ordered before it here)
    if constexpr (Consumer::kAsyncProxy) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();        // everyone's have, and everyone is done with slot_p (consumed last round)
    slot_p = refill_stage<S>(pw, u_end, slot_p, load, advance);

    con.stage(base + slot_c * kStageBytes);  // done with the slot when it returns
    slot_c = slot_c + 1 == S ? 0 : slot_c + 1;
    if (++cw.k == nk) {
      con.store(a, cw.un, cw.un.pass0 + cw.pass);
      cw.k = 0;
      if (++cw.pass >= cw.un.passes) {
        cw.pass = 0;
        cw.u = U.taken ? ring.consumer_next() : cw.u + 1;
        if (cw.u < u_end) cw.un = U.at(cw.u, c_hint);
      }
      con.begin(cw.un, cw.un.pass0 + cw.pass);
    }
  }
  wait_pending<0>();
  if (U.taken) release_counter(a.ctr);
  // down lets the combine launch only now: blocks waiting beside it would take issue slots
  if constexpr (!kGateUp) griddep_launch();
}

}  // namespace lfm2::cuda::moe_gemm
