// A dynamic persistent tile scheduler for the padded FP8 products (padded_gemm_sm90.cuh): clusters
// take their work units from a global counter as they finish, not a fixed stride, so SMs that run
// faster take more units (ncu of the fused gate/up at 8,192 tokens: 892 k cycles elapsed against
// 822 k active on an average SM, the busiest +6.7 %, the idlest -6.4 %; H200, twenty-seventh session).
// Measured (H200, twenty-eighth session, one call): that launch 495 -> 479 us, the busiest SM +9.9 %
// -> +5.3 % of the average; the scoring microbatch's 44 CUTLASS launches 16.5 / 16.2 -> 15.6 / 15.7 ms.
//
// CUTLASS 4.2's sm90 cooperative kernel has the slots for a dynamic scheduler (IsDynamicPersistent:
// a scheduler warp, a pipeline of work responses in shared memory); only sm100's CLC scheduler fills
// them. Here the pipeline is a ring of unit ids in every CTA of the cluster: CTA 0's scheduler warp
// draws the next unit from the counter and writes it into both CTAs' slot (st.async completing the
// bytes each CTA's full barrier expects, as a CLC response lands); every warp that walks the tiles
// (the scheduler, mainloop, scales and 8 MMA warps of each CTA) reads its own CTA's slot and arrives
// on CTA 0's empty barrier. Each warp keeps its own read position (the kernel's scales warp does
// not advance the state it is given). A unit is a cluster's tile (kGateUpPairs: its gate tile, then its up tile,
// the second without a draw). Units are numbered along N first (raster AlongN), so the units of the
// rows in use (moe_pad_rows' *used_rows) are a prefix: past it, a unit is the invalid tile.
//
// The same tiles and arithmetic as PaddedTileScheduler, in another order: the same bits.
// Included only by translation units built for sm_90a.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/pipeline/pipeline.hpp"

namespace lfm2::cuda::grouped::padded {

// The CTAs of this CTA's cluster.
__device__ __forceinline__ uint32_t cluster_ctas() {
  const dim3 cs = cute::cluster_shape();
  return cs.x * cs.y * cs.z;
}

namespace cluster_mbar {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void init(uint64_t* bar, uint32_t count) {
  cutlass::arch::ClusterBarrier::init(bar, count);
}
// Arrive on CTA `cta`'s copy of bar (CUTLASS's remote arrive, as its pipelines' consumer_release).
__device__ __forceinline__ void arrive(uint64_t* bar, uint32_t cta) {
  cutlass::arch::ClusterBarrier::arrive(bar, cta, 1);
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) { cutlass::arch::ClusterBarrier::wait(bar, phase); }
// CTA `cta`'s *p = v, completing 4 bytes of the transaction its copy of bar expects (arrive_tx), as
// a TMA multicast or a CLC response lands: one arrival, with the bytes, on the remote barrier.
__device__ __forceinline__ void put(int32_t* p, uint64_t* bar, uint32_t cta, int32_t v) {
  asm volatile(
      "{\n\t.reg .b32 rp, rb;\n\t"
      "mapa.shared::cluster.u32 rp, %0, %2;\n\t"
      "mapa.shared::cluster.u32 rb, %1, %2;\n\t"
      "mbarrier.arrive.expect_tx.shared::cluster.b64 _, [rb], 4;\n\t"
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [rp], %3, [rb];\n\t}\n" ::"r"(smem_addr(p)),
      "r"(smem_addr(bar)), "r"(cta), "r"(v)
      : "memory");
}

}  // namespace cluster_mbar

// The problem a padded scheduler walks: kGateUpPairs, the gate half of N (each gate tile's up tile
// follows it without a draw of its own).
template <bool kGateUpPairs, class ProblemShapeMNKL>
CUTLASS_HOST_DEVICE auto walked_shape(ProblemShapeMNKL shape) {
  if constexpr (kGateUpPairs) {
    auto s = cute::append<4>(shape, cute::Int<1>{});
    return cute::make_shape(cute::get<0>(s), cute::get<1>(s) / 2, cute::get<2>(s), cute::get<3>(s));
  } else {
    return shape;
  }
}

// The ring of unit ids, as the kernel's scheduler pipeline (its Params and ThreadCategory are the
// ones the kernel fills; the counts it passes are not used: the ring counts warps, kWalkers a CTA).
template <int kSlots, int kWalkers>
class UnitRing {
 public:
  static constexpr uint32_t Stages = kSlots;
  using PipelineState = cutlass::PipelineState<kSlots>;
  enum class ThreadCategory { NonParticipant, Producer, Consumer, ProducerConsumer };
  struct Params {
    uint32_t transaction_bytes = 0;
    ThreadCategory role = ThreadCategory::NonParticipant;
    uint32_t producer_blockid = 0;
    uint32_t producer_arv_count = 0;
    uint32_t consumer_arv_count = 0;
    int initializing_warp = 0;
  };
  struct SharedStorage {
    alignas(16) int32_t unit[kSlots];
    alignas(8) uint64_t full[kSlots];
    alignas(8) uint64_t empty[kSlots];
  };

  CUTLASS_DEVICE UnitRing(SharedStorage& s, Params const&) : s_(&s) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < kSlots; ++i) {
        cluster_mbar::init(&s.full[i], 1);
        cluster_mbar::init(&s.empty[i], kWalkers * cluster_ctas());
      }
    }
    cutlass::arch::fence_barrier_init();
  }

  // CTA 0's scheduler warp: slot `state` (once every walker of the cluster has read its last use)
  // = unit, in every CTA.
  CUTLASS_DEVICE void put(PipelineState state, int32_t unit) {
    cluster_mbar::wait(&s_->empty[state.index()], state.phase());
    if (cute::elect_one_sync()) {
      for (uint32_t c = 0; c < cluster_ctas(); ++c)
        cluster_mbar::put(&s_->unit[state.index()], &s_->full[state.index()], c, unit);
    }
    __syncwarp();
  }

  // A walker warp: the unit in slot `state`, the slot released to CTA 0.
  CUTLASS_DEVICE int32_t take(PipelineState state) {
    cluster_mbar::wait(&s_->full[state.index()], state.phase());
    const int32_t unit = *reinterpret_cast<volatile int32_t*>(&s_->unit[state.index()]);
    __syncwarp();
    if (cute::elect_one_sync()) cluster_mbar::arrive(&s_->empty[state.index()], 0);
    __syncwarp();
    return unit;
  }

  // CTA 0 must outlive every walker's arrival on its empty barriers: wait for the ring's last uses.
  CUTLASS_DEVICE void producer_tail(PipelineState state) {
    if (cute::block_rank_in_cluster() != 0) return;
    for (int i = 0; i < kSlots; ++i, ++state) cluster_mbar::wait(&s_->empty[state.index()], state.phase());
  }

 private:
  SharedStorage* s_;
};

// No throttling of the draws (the kernel's throttle pipeline calls, all no-ops).
struct NoThrottle {
  static constexpr uint32_t Stages = 1;
  using PipelineState = cutlass::PipelineState<1>;
  enum class ThreadCategory { NonParticipant, Producer, Consumer, ProducerConsumer };
  struct Params {
    uint32_t producer_arv_count = 0;
    uint32_t consumer_arv_count = 0;
    uint32_t dst_blockid = 0;
    int initializing_warp = 0;
    ThreadCategory role = ThreadCategory::NonParticipant;
  };
  struct SharedStorage {};
  CUTLASS_DEVICE NoThrottle(SharedStorage&, Params const&) {}
  CUTLASS_DEVICE void producer_acquire(PipelineState) {}
  CUTLASS_DEVICE void producer_commit(PipelineState) {}
  CUTLASS_DEVICE void consumer_wait(PipelineState) {}
  CUTLASS_DEVICE void consumer_release(PipelineState) {}
};

// kWalkers: the warps of a CTA that walk the tiles (the blockwise FP8 cooperative kernel: the
// scheduler, mainloop and scales warps and 8 MMA warps).
template <bool kGateUpPairs, int kWalkers = 11, int kSlots = 4>
class PaddedDynamicScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  static constexpr bool IsDynamicPersistent = true;
  using Pipeline = UnitRing<kSlots, kWalkers>;
  using ThrottlePipeline = NoThrottle;
  struct CLCResponse {
    int32_t unit;
  };
  class SharedStorage {
   public:
    CUTLASS_DEVICE typename Pipeline::SharedStorage& pipeline() { return ring_; }
    CUTLASS_DEVICE NoThrottle::SharedStorage& throttle_pipeline() { return throttle_; }
    CUTLASS_DEVICE CLCResponse* data() { return nullptr; }

   private:
    typename Pipeline::SharedStorage ring_;
    NoThrottle::SharedStorage throttle_;
  };

  struct Arguments : Base::Arguments {
    const int32_t* used_rows = nullptr;  // device; null: every row
  };
  struct Params : Base::Params {
    const int32_t* used_rows = nullptr;
    int32_t* counter = nullptr;  // the workspace: units drawn so far past the first wave
    int32_t half_tiles = 0;      // kGateUpPairs: the N tiles of the gate half
  };

  CUTLASS_HOST_DEVICE static Base::Arguments along_n(Arguments const& args) {
    Base::Arguments a = args;
    a.raster_order = RasterOrderOptions::AlongN;  // the units of the rows in use: a prefix
    a.max_swizzle_size = 1;
    return a;
  }

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL shape, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* workspace = nullptr, uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params p;
    const auto walked = walked_shape<kGateUpPairs>(shape);
    static_cast<Base::Params&>(p) = Base::to_underlying_arguments(walked, tile, cluster, hw_info, along_n(args),
                                                                  workspace, epilogue_subtile,
                                                                  ktile_start_alignment_count);
    p.used_rows = args.used_rows;
    p.counter = static_cast<int32_t*>(workspace);
    p.half_tiles = int32_t(cute::get<1>(shape) / 2 / cute::size<1>(tile));
    return p;
  }

  template <class ProblemShapeMNKL, class BlockShape, class ClusterShape>
  CUTLASS_HOST_DEVICE static dim3 get_grid_shape(Params const& params, ProblemShapeMNKL shape, BlockShape cta,
                                                 ClusterShape cluster, cutlass::KernelHardwareInfo hw_info,
                                                 Arguments arguments = Arguments{}, bool truncate = true) {
    const auto walked = walked_shape<kGateUpPairs>(shape);
    return Base::get_grid_shape(params, walked, cta, cluster, hw_info, along_n(arguments), truncate);
  }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape, cutlass::KernelHardwareInfo const&, uint32_t,
                                   const uint32_t = 1, uint32_t = 1) {
    return 16;
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void* workspace, cudaStream_t stream, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t, const uint32_t = 1,
                                              uint32_t = 1, cutlass::CudaHostAdapter* = nullptr) {
    if (workspace == nullptr) return cutlass::Status::kErrorWorkspaceNull;
    return cudaMemsetAsync(workspace, 0, sizeof(int32_t), stream) == cudaSuccess ? cutlass::Status::kSuccess
                                                                                 : cutlass::Status::kErrorInternal;
  }

  CUTLASS_HOST_DEVICE PaddedDynamicScheduler() {}
  CUTLASS_DEVICE explicit PaddedDynamicScheduler(Params const& p) : Base(p), p_(p) {
    const uint64_t cluster = cluster_ctas();
    const uint64_t linear = uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x);  // AlongN
    cta_in_cluster_ = uint32_t(linear % cluster);
    clusters_ = int32_t(uint64_t(gridDim.x) * gridDim.y * gridDim.z / cluster);
    first_unit_ = int32_t(linear / cluster);
    const int64_t per_m = int64_t(p.divmod_cluster_blk_major_.divisor);  // cluster units along N
    const int64_t tiles_m = int64_t(p.blocks_per_problem_ / cluster) / per_m;
    used_units_ = int32_t((p.used_rows ? int64_t(*p.used_rows / 128) : tiles_m) * per_m);
  }

  CUTLASS_DEVICE void set_data_ptr(CLCResponse*) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return unit_tile(first_unit_);
  }

  // The scheduler warp: the next unit drawn (by CTA 0) into the ring.
  CUTLASS_DEVICE typename Pipeline::PipelineState advance_to_next_work(Pipeline& ring,
                                                                        typename Pipeline::PipelineState state) const {
    if (cute::block_rank_in_cluster() == 0) {
      int32_t unit = 0;
      if (cutlass::canonical_lane_idx() == 0) unit = clusters_ + atomicAdd(p_.counter, 1);
      ring.put(state, __shfl_sync(0xffffffffu, unit, 0));
    }
    ++state;
    return state;
  }

  // Every walker: kGateUpPairs, a gate tile's up tile first (no draw); else the ring's next unit.
  template <class Ring, class State>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo w, Ring& ring, State) {
    if constexpr (kGateUpPairs) {
      if (w.N_idx < p_.half_tiles) {
        w.N_idx += p_.half_tiles;
        return cute::make_tuple(w, false);
      }
    }
    const WorkTileInfo next = unit_tile(ring.take(read_));
    ++read_;
    return cute::make_tuple(next, true);
  }
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo w) { return cute::make_tuple(w, true); }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo&, uint32_t = 1) const { return false; }

 private:
  // Unit u: this CTA's tile of cluster tile u, or the invalid tile past the rows in use.
  CUTLASS_DEVICE WorkTileInfo unit_tile(int32_t u) const {
    if (u >= used_units_) return WorkTileInfo::invalid_work_tile();
    const uint64_t cluster = cluster_ctas();
    return get_current_work_for_linear_idx(uint64_t(u) * cluster + cta_in_cluster_);
  }

  Params p_;
  typename Pipeline::PipelineState read_{};  // this warp's position in the ring
  uint32_t cta_in_cluster_ = 0;
  int32_t clusters_ = 0, first_unit_ = 0, used_units_ = 0;
};

}  // namespace lfm2::cuda::grouped::padded
