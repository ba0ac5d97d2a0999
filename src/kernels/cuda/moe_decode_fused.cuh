// The decode expert products' two launches as one grid (variants 13-15 of
// moe_experts_decode.cu; sm_90a only, instantiated in moe_decode_wgmma.cu): gate/up's units, then
// down's, taken from one counter, so a block that runs out of gate/up units streams down's weights
// at once instead of draining while gate/up's last units finish and down's grid ramps up.
//
// Units: u < U13 is gate/up's unit u (moe_decode_gemm.cuh's unit_of over its tiles), u >= U13
// down's unit u - U13; the counter hands them out in that order, so every gate/up unit is taken
// before any down unit. A down unit of expert e reads act rows that all of e's gate/up units write:
// each gate/up unit, once its last pass is stored, adds one to ready[e] (the block's barrier, then
// thread 0's release add, as CUTLASS's split-K semaphores), and the producer issues a down unit's
// first stage only once ready[e] holds all of e's gate/up units (thread 0's acquire load before the
// stage's barrier). Until then it issues nothing and the consumer goes on through the stages
// already issued; if none is left, thread 0 waits on the flag. No deadlock: a gate/up unit waits
// for nothing, and a producer only waits once every stage of its block's gate/up units is issued,
// which the consumer then finishes on its own.
//
// The pipeline's groups: one cp.async group per issued stage and none empty, so before consuming
// stage c the thread waits until at most (issued - c - 1) groups are pending (S - 2 in the steady
// state, as moe_gemm_kernel's loop).
//
// Exactness: a unit's stages, tiles and wgmma sequence are moe_gemm_kernel's with WgmmaConsumer, so
// an element's bits are variant 9's whichever block or order computes it (tested bit for bit).
#pragma once

#include "kernels/cuda/moe_decode_wgmma.cuh"

namespace lfm2::cuda::moe_gemm {

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// cp.async.wait_group n for n in [0, S - 2] (the groups after the stage to consume).
template <int S>
__device__ __forceinline__ void wait_at_most(int n) {
  if (n >= S - 2) {
    wait_pending<S - 2>();
    return;
  }
  switch (n) {
    case 0: wait_pending<0>(); break;
    case 1: wait_pending<1>(); break;
    case 2: wait_pending<2>(); break;
    default: wait_pending<3>(); break;
  }
}

// The launch's units: gate/up's (t13 row tiles an expert) then down's (t2), over the touched experts.
struct FusedUnits {
  int64_t t13, t2, u13, units;
  const int* touched;
  const int* off;
  int nk13, nk2;  // 64-k steps of a gate/up and of a down unit
  __device__ __forceinline__ Unit at(int64_t u) const {
    return u < u13 ? unit_of(u, t13, touched, off) : unit_of(u - u13, t2, touched, off);
  }
  __device__ __forceinline__ int nk(bool gate_up) const { return gate_up ? nk13 : nk2; }
};

__device__ __forceinline__ FusedUnits fused_units(const FusedArgs& f, int count, const int* touched, const int* off) {
  FusedUnits U;
  U.t13 = (f.up.R + 63) / 64;
  U.t2 = (f.down.R + kBM - 1) / kBM;
  U.u13 = int64_t(count) * U.t13;
  U.units = U.u13 + int64_t(count) * U.t2;
  U.touched = touched;
  U.off = off;
  U.nk13 = int((f.up.K + kBK - 1) / kBK);
  U.nk2 = int((f.down.K + kBK - 1) / kBK);
  return U;
}

// The producer side: unit u (gate/up's when gu), pass pp, k step pk; ready: it may issue (a down
// unit's expert has all its act rows); live: units left. Every thread runs it alike (UnitRing's
// barrier in advance).
template <typename T>
struct FusedProducer {
  Feeder<T, true, true> fu;
  Feeder<T, false, true> fd;
  int64_t u = 0;
  Unit un;
  bool gu = true, ready = true, live = true;
  int pp = 0, pk = 0, issued = 0;

  __device__ __forceinline__ void start(const FusedArgs& f, const FusedUnits& U, int64_t u0) {
    l2_policies(f.up.l2_hints != 0, fu.pol_w, fu.pol_x);
    fd.pol_w = fu.pol_w;
    fd.pol_x = fu.pol_x;
    u = u0;
    set_unit(f, U);
    set_pass(f);
  }
  __device__ __forceinline__ void set_unit(const FusedArgs& f, const FusedUnits& U) {
    un = U.at(u);
    gu = u < U.u13;
    ready = gu;
    if (gu)
      fu.set_unit(f.up, un);
    else
      fd.set_unit(f.down, un);
  }
  __device__ __forceinline__ void advance(const FusedArgs& f, const FusedUnits& U, UnitRing& ring) {
    if (++pk < U.nk(gu)) return;
    pk = 0;
    if (++pp >= un.passes) {
      pp = 0;
      u = ring.producer_next();
      if (u >= U.units) {
        live = false;
        return;
      }
      set_unit(f, U);
    }
    set_pass(f);
  }
  __device__ __forceinline__ void set_pass(const FusedArgs& f) {
    if (gu)
      fu.set_pass(f.up, un, pp);
    else
      fd.set_pass(f.down, un, pp);
  }
  // the next stage into slot issued % S (one cp.async group), then one stage on
  template <int S>
  __device__ __forceinline__ void issue(const FusedArgs& f, const FusedUnits& U, UnitRing& ring, uint32_t base) {
    const uint32_t st = base + uint32_t(issued % S) * kStageBytes;
    if (gu) {
      fu.load_w(f.up, st, pk);
      fu.load_x(f.up, st, pk);
    } else {
      fd.load_w(f.down, st, pk);
      fd.load_x(f.down, st, pk);
    }
    commit();
    ++issued;
    advance(f, U, ring);
  }
};

// Thread 0: whether ready[e] holds all of e's t13 gate/up units (acquire); waits for it when
// `drained` (the block has no stage left to consume).
__device__ __forceinline__ bool poll_ready(const int* ready, int e, int64_t t13, bool drained) {
  int v = ld_acquire(ready + e);
  while (drained && v < t13) {
    __nanosleep(64);
    v = ld_acquire(ready + e);
  }
  return v >= t13;
}

template <typename T, int S>
__global__ void __launch_bounds__(kThreads, S == 4 ? 2 : 1) moe_fused_kernel(const FusedArgs f) {
  using Con = WgmmaConsumer<T, true>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int s_count;
  __shared__ int s_flag[2];  // thread 0's readiness poll, double-buffered across the loop's barriers
  unsigned char* smem =
      smem_raw + ((Con::kPad - (uint32_t(__cvta_generic_to_shared(smem_raw)) & (Con::kPad - 1))) & (Con::kPad - 1));
  int* s_off = reinterpret_cast<int*>(smem + S * kStageBytes);
  int* s_touched = s_off + f.up.n_experts + 1;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));

  gate_up_wait<T>(f.up);
  load_touched(f.up.offsets, f.up.n_experts, s_off, s_touched, s_count);
  const FusedUnits U = fused_units(f, s_count, s_touched, s_off);

  // every unit from the counter, the first too: a unit is then always held by a running block, so
  // a block waiting on ready[] never waits on a block that is not resident. first_by_block: unit
  // blockIdx.x first (the one gate_up_wait prefetched), safe while every block of the grid becomes
  // resident without waiting on this grid (the grid is sized to the SMs' room for it)
  const bool by_block = f.first_by_block != 0;
  UnitRing ring(f.up.ctr, s_off + kIndexInts, by_block ? int(gridDim.x) : 0);
  const int64_t u0 = by_block ? int64_t(blockIdx.x) : ring.producer_next();
  if (!by_block) ring.consumer_next();
  if (u0 >= U.units) {
    release_counter(f.up.ctr, f.ready, f.up.n_experts);
    return;
  }
  FusedProducer<T> pr;
  pr.start(f, U, u0);
  while (pr.issued < S - 1 && pr.live && pr.ready) pr.template issue<S>(f, U, ring, base);

  int64_t cu = u0;  // the consumer's unit, pass and k step
  Unit cun = U.at(cu);
  bool cgu = cu < U.u13;
  int cp = 0, ck = 0, consumed = 0, par = 0;
  Con con;
  while (cu < U.units) {
    const bool poll = pr.live && !pr.ready, drained = pr.issued == consumed;
    if (poll && threadIdx.x == 0) s_flag[par] = poll_ready(f.ready, pr.un.e, U.t13, drained);
    if (!drained) wait_at_most<S>(pr.issued - consumed - 1);  // this thread's copies of stage `consumed`
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // everyone's copies have landed; everyone is done with the stage consumed last round
    if (poll) pr.ready = s_flag[par] != 0;
    par ^= 1;
    if (pr.live && pr.ready && pr.issued - consumed < S) pr.template issue<S>(f, U, ring, base);
    if (drained) {  // the stage just issued is the one to consume
      wait_pending<0>();
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
    }
    con.stage(base + uint32_t(consumed % S) * kStageBytes);
    ++consumed;
    if (++ck < U.nk(cgu)) continue;
    ck = 0;
    if (cgu)
      con.template store_as<true>(f.up, cun, cp);
    else
      con.template store_as<false>(f.down, cun, cp);
    if (++cp < cun.passes) continue;
    if (cgu) {  // the unit's act rows are written: one more of its expert's gate/up units
      __syncthreads();
      if (threadIdx.x == 0) add_release(f.ready + cun.e, 1);
    }
    cp = 0;
    cu = ring.consumer_next();
    if (cu < U.units) {
      cun = U.at(cu);
      cgu = cu < U.u13;
    }
  }
  wait_pending<0>();
  release_counter(f.up.ctr, f.ready, f.up.n_experts);
  griddep_launch();  // the combine launches only now: blocks waiting beside this grid would take issue slots
}

}  // namespace lfm2::cuda::moe_gemm
