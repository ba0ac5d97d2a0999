// The pieces of the FP8 experts' products over rows padded per expert that both of their CUTLASS
// translation units use (moe_padded_gemm_fp8.cu: the plain product; moe_padded_swiglu_fp8.cu: gate/up
// with the SwiGLU and its quantization in the epilogue): the mainloop that gives each 128-row tile
// its own expert's weights (over OverlappedPromotion, overlapped_promotion_sm90.cuh: each k tile's
// promotion while the next tile's wgmmas run), and the persistent scheduler that skips the tiles
// past the rows in use (and, for gate/up, hands each CTA a gate tile and then the up tile of the
// same rows and columns).
// Included only by translation units built for sm_90a.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/error.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "kernels/cuda/overlapped_promotion_sm90.cuh"
#include "kernels/cuda/padded_dynamic_scheduler_sm90.cuh"

namespace lfm2::cuda::grouped::padded {

using namespace cute;

// The tensor t with its last mode's stride 0: indexing it at any batch coordinate reads batch 0.
template <class T>
CUTE_HOST_DEVICE auto batch_ignored(T const& t) {
  constexpr int R = decltype(rank(t.layout()))::value;
  return make_tensor(t.data(), make_layout(shape(t.layout()), replace<R - 1>(stride(t.layout()), Int<0>{})));
}

// CUTLASS's blockwise mainloop with the batch coordinate l of a tile replaced by its expert
// (tile_expert[m tile]) and the problem's batch count by the number of experts: B's and B's
// scales' TMA and tiles span the E experts, while A's and A's scales' tiles ignore l.
template <class Base>
struct PaddedMainloop : Base {
  struct Arguments : Base::Arguments {
    const int32_t* tile_expert;  // (m_pad / 128): the expert of each 128-row tile
    int n_experts;
  };
  struct Params : Base::Params {
    const int32_t* tile_expert;
    int n_experts;
  };

  template <class Shape4>
  CUTE_HOST_DEVICE static auto with_experts(Shape4 const& shape, int n_experts) {
    auto s = append<4>(shape, 1);
    return make_shape(get<0>(s), get<1>(s), get<2>(s), n_experts);
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) =
        Base::to_underlying_arguments(with_experts(shape, args.n_experts), args, workspace);
    p.tile_expert = args.tile_expert;
    p.n_experts = args.n_experts;
    return p;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, Arguments const& args) {
    return Base::can_implement(with_experts(shape, args.n_experts), args);
  }

  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params) const {
    auto t = Base::load_init(with_experts(shape, params.n_experts), params);
    return make_tuple(batch_ignored(get<0>(t)), get<1>(t), batch_ignored(get<2>(t)), get<3>(t));
  }

  template <class BlockCoord>
  CUTLASS_DEVICE static auto expert_coord(BlockCoord const& blk, Params const& params) {
    auto [m, n, k, l] = blk;
    return make_coord(m, n, k, decltype(l)(params.tile_expert[m]));
  }

  template <class Pipeline, class State, class Inputs, class BlockCoord, class... Rest>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, State state, Inputs const& inputs,
                           BlockCoord const& blk, Rest&&... rest) {
    Base::load(params, pipeline, state, inputs, expert_coord(blk, params), static_cast<Rest&&>(rest)...);
  }

  template <class Pipeline, class State, class Inputs, class BlockCoord, class... Rest>
  CUTLASS_DEVICE void load_auxiliary(Params const& params, Pipeline pipeline, State state, Inputs const& inputs,
                                     BlockCoord const& blk, Rest&&... rest) {
    Base::load_auxiliary(params, pipeline, state, inputs, expert_coord(blk, params), static_cast<Rest&&>(rest)...);
  }
};

// CUTLASS's static persistent scheduler without the tiles past the rows in use: moe_padded_rows
// reserves room for the worst routing (up to 127 padding rows an expert), the routing at hand uses
// *used_rows of them (a multiple of 128, written by moe_pad_rows on the device), and the tiles from
// M index *used_rows / 128 on are skipped (~7 % of a product's tiles at 8,192 tokens x top-4 over 32
// experts). Every warp role runs its own copy of the scheduler, and the skip depends on the M index
// alone, so they agree on every tile, as do a cluster's CTAs (1 x 2: the same M index). The count is
// read when the scheduler is made: the GEMM is not launched with programmatic dependent launch, so
// moe_pad_rows has finished by then.
//
// kGateUpPairs: the product is gate/up ([w1; w3], N = 2 inter) and the scheduler walks the tiles of
// the first half of N only, each one twice in a row: first as itself (a gate tile, N index n), then
// as the up tile of the same rows and columns (N index n + inter / 128), so the epilogue of the up
// tile finds its gate tile's values where that CTA left them. The cluster's two CTAs (adjacent N
// tiles) stay in step. inter / 128 must be a multiple of the cluster's N (no CTA of a cluster
// rounded up past the gate half; the launcher checks).
template <bool kGateUpPairs>
class PaddedTileScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  struct Arguments : Base::Arguments {
    const int32_t* used_rows = nullptr;  // device; null: every row
  };
  struct Params : Base::Params {
    const int32_t* used_rows = nullptr;
    int32_t half_tiles = 0;  // kGateUpPairs: the N tiles of the gate half
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL shape, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* workspace = nullptr, uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params p;
    const auto walked = walked_shape<kGateUpPairs>(shape);
    static_cast<Base::Params&>(p) = Base::to_underlying_arguments(walked, tile, cluster, hw_info, args, workspace,
                                                                  epilogue_subtile, ktile_start_alignment_count);
    p.used_rows = args.used_rows;
    p.half_tiles = int32_t(cute::get<1>(shape) / 2 / cute::size<1>(tile));
    return p;
  }

  template <class ProblemShapeMNKL, class BlockShape, class ClusterShape>
  CUTLASS_HOST_DEVICE static dim3 get_grid_shape(Params const& params, ProblemShapeMNKL shape, BlockShape cta,
                                                 ClusterShape cluster, cutlass::KernelHardwareInfo hw_info,
                                                 Arguments arguments = Arguments{}, bool truncate = true) {
    const auto walked = walked_shape<kGateUpPairs>(shape);
    return Base::get_grid_shape(params, walked, cta, cluster, hw_info, arguments, truncate);
  }

  CUTLASS_HOST_DEVICE PaddedTileScheduler() {}
  CUTLASS_DEVICE explicit PaddedTileScheduler(Params const& p)
      : Base(p), used_tiles_(p.used_rows ? *p.used_rows / 128 : INT32_MAX), half_tiles_(p.half_tiles) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape cluster) {
    return skip_unused(Base::initial_work_tile_info(cluster));
  }
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo w) {
    if constexpr (kGateUpPairs) {
      if (w.N_idx < half_tiles_) {  // the gate tile done: its up tile next
        w.N_idx += half_tiles_;
        return cute::make_tuple(w, true);
      }
    }
    auto next = Base::fetch_next_work(w);
    return cute::make_tuple(skip_unused(cute::get<0>(next)), cute::get<1>(next));
  }
  template <class Pipeline, class State>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo w, Pipeline&, State) {
    return fetch_next_work(w);
  }

 private:
  CUTLASS_DEVICE WorkTileInfo skip_unused(WorkTileInfo w) {
    while (w.is_valid() && w.M_idx >= used_tiles_) {
      Base::advance_to_next_work();
      w = Base::get_current_work();
    }
    return w;
  }
  int32_t used_tiles_ = INT32_MAX;
  int32_t half_tiles_ = 0;
};

// GemmUniversal's tag for one of these schedulers (PaddedTileScheduler, PaddedDynamicScheduler): the
// specialization below hands the kernel the scheduler itself.
template <class Scheduler>
struct SchedulerTag {};

}  // namespace lfm2::cuda::grouped::padded

namespace cutlass::gemm::kernel::detail {
template <class S, class ArchTag, class TileShape, class ClusterShape, uint32_t Stages>
struct TileSchedulerSelector<lfm2::cuda::grouped::padded::SchedulerTag<S>, ArchTag, TileShape, ClusterShape, Stages> {
  using Scheduler = S;
};
}  // namespace cutlass::gemm::kernel::detail

namespace lfm2::cuda::grouped::padded {

// The tile (128 x 128 x 128: the grouped kernel's, so the same sums) and the cluster (1 x 2: A
// multicast to the two N tiles) of both products.
using Tile = Shape<_128, _128, _128>;
using Cluster = Shape<_1, _2, _1>;

// A packed (rows, cols, batch) stride: (cols, 1, batch).
template <class Stride>
Stride rows_stride(int64_t cols, int64_t batch) {
  Stride s{};
  get<0>(s) = cols;
  get<2>(s) = batch;
  return s;
}

// The blockwise-scaled GEMM over padded rows with the given epilogue (whose shared memory the
// mainloop's stages leave room for): A (m_pad, n_in) e4m3 with one scale per (row, 128 columns),
// each M tile's B its expert's (n_out, n_in) e4m3 with 128 x 128 block scales.
// kDynamic: units drawn from a counter (padded_dynamic_scheduler_sm90.cuh), not a fixed stride.
template <class Epilogue, bool kGateUpPairs, bool kDynamic = false>
struct PaddedGemm {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  static constexpr int kAlignAB = 16;
  using BaseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, kAlignAB, ElementB,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;
  using Mainloop = PaddedMainloop<OverlappedPromotion<BaseMainloop>>;
  using Scheduler =
      std::conditional_t<kDynamic, PaddedDynamicScheduler<kGateUpPairs>, PaddedTileScheduler<kGateUpPairs>>;
  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, SchedulerTag<Scheduler>>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using Arguments = typename Gemm::Arguments;

  // Everything but the epilogue's arguments.
  static Arguments arguments(const uint8_t* in, const float* in_scales, const uint8_t* w, const float* w_scales,
                             const int32_t* tile_expert, const int32_t* used_rows, int m_pad, int n_experts, int n_in,
                             int n_out, int device, int sm_count) {
    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {m_pad, n_out, n_in, 1};
    auto& ml = args.mainloop;
    ml.ptr_A = reinterpret_cast<const ElementA*>(in);
    ml.dA = rows_stride<typename GemmKernel::StrideA>(n_in, int64_t(m_pad) * n_in);
    ml.ptr_B = reinterpret_cast<const ElementB*>(w);
    ml.dB = rows_stride<typename GemmKernel::StrideB>(n_in, int64_t(n_out) * n_in);  // expert e's at w + e N K
    ml.ptr_SFA = in_scales;
    ml.layout_SFA = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m_pad, n_out, n_in, 1));
    ml.ptr_SFB = w_scales;
    ml.layout_SFB = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m_pad, n_out, n_in, n_experts));
    ml.tile_expert = tile_expert;
    ml.n_experts = n_experts;
    args.scheduler.used_rows = used_rows;
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  // The checked launch; what names the product in the errors.
  static void run(const Arguments& args, void* workspace, cudaStream_t stream, const char* what) {
    Gemm gemm;
    cutlass::Status st = gemm.can_implement(args);
    LFM2_CHECK(st == cutlass::Status::kSuccess, what, ": CUTLASS cannot implement ", get<0>(args.problem_shape),
               " rows x (", get<1>(args.problem_shape), ", ", get<2>(args.problem_shape), ") x ",
               args.mainloop.n_experts, " experts: ", cutlassGetStatusString(st));
    st = gemm.initialize(args, workspace, stream);
    LFM2_CHECK(st == cutlass::Status::kSuccess, what, ": initialize: ", cutlassGetStatusString(st));
    st = gemm.run(stream);
    LFM2_CHECK(st == cutlass::Status::kSuccess, what, ": run: ", cutlassGetStatusString(st));
    CUDA_CHECK_LAUNCH(what);
  }
};

}  // namespace lfm2::cuda::grouped::padded
