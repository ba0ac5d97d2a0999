// The FP8 experts' product over rows padded per expert (grouped_gemm_fp8.h:
// moe_grouped_matmul_fp8_padded): ONE GEMM of CUTLASS's sm90 blockwise-scaled kernel (not the
// ptr-array one) over every expert's rows, A (m_pad, K) with each expert's rows starting at a
// multiple of the 128-row tile, and the weights (E, N, K) as a batch of E matrices of which each M
// tile reads the one that tile_expert names. CUTLASS's grouped kernel switches TMA descriptors
// whenever a CTA's next tile is in another group (nearly every tile here: 32 experts, one wave of
// 132 tiles); this one uses the same descriptors for every tile. The mainloop is CUTLASS's,
// wrapped (PaddedMainloop) so that the batch coordinate of a tile is its expert for B and its
// scales while A and A's scales ignore it: one matrix of all rows. Same tile (128 x 128 x 128),
// promotion per 128-deep block and epilogue as the grouped kernel, so the same sums. The tiles past
// the rows the routing uses are skipped (PaddedTileScheduler).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "common/error.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "kernels/cuda/grouped_gemm_fp8.h"

namespace lfm2::cuda::grouped {
namespace {

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
class PaddedTileScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  struct Arguments : Base::Arguments {
    const int32_t* used_rows = nullptr;  // device; null: every row
  };
  struct Params : Base::Params {
    const int32_t* used_rows = nullptr;
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL shape, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* workspace = nullptr, uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params p;
    static_cast<Base::Params&>(p) = Base::to_underlying_arguments(shape, tile, cluster, hw_info, args, workspace,
                                                                  epilogue_subtile, ktile_start_alignment_count);
    p.used_rows = args.used_rows;
    return p;
  }

  CUTLASS_HOST_DEVICE PaddedTileScheduler() {}
  CUTLASS_DEVICE explicit PaddedTileScheduler(Params const& p)
      : Base(p), used_tiles_(p.used_rows ? *p.used_rows / 128 : INT32_MAX) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape cluster) {
    return skip_unused(Base::initial_work_tile_info(cluster));
  }
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo w) {
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
};

struct PaddedScheduler {};  // GemmUniversal's tag for PaddedTileScheduler (the specialization below)

}  // namespace
}  // namespace lfm2::cuda::grouped

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t Stages>
struct TileSchedulerSelector<lfm2::cuda::grouped::PaddedScheduler, ArchTag, TileShape, ClusterShape, Stages> {
  using Scheduler = lfm2::cuda::grouped::PaddedTileScheduler;
};
}  // namespace cutlass::gemm::kernel::detail

namespace lfm2::cuda::grouped {
namespace {

struct PaddedKernel {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16, kAlignD = 8;
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_1, _2, _1>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, ElementD, LayoutD,
      kAlignD, cutlass::epilogue::TmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using BaseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, kAlignAB,
      ElementB, cute::tuple<LayoutB, LayoutSFB>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;
  using Mainloop = PaddedMainloop<BaseMainloop>;
  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, PaddedScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
};

// A packed (rows, cols, batch) stride: (cols, 1, batch).
template <class Stride>
Stride rows_stride(int64_t cols, int64_t batch) {
  Stride s{};
  get<0>(s) = cols;
  get<2>(s) = batch;
  return s;
}

typename PaddedKernel::Gemm::Arguments padded_args(__nv_bfloat16* out, const uint8_t* in, const float* in_scales,
                                                   const uint8_t* w, const float* w_scales,
                                                   const int32_t* tile_expert, const int32_t* used_rows, int m_pad,
                                                   int n_experts, int n_in, int n_out, int device, int sm_count) {
  using K = PaddedKernel;
  typename K::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m_pad, n_out, n_in, 1};
  auto& ml = args.mainloop;
  ml.ptr_A = reinterpret_cast<const K::ElementA*>(in);
  ml.dA = rows_stride<K::StrideA>(n_in, int64_t(m_pad) * n_in);
  ml.ptr_B = reinterpret_cast<const K::ElementB*>(w);
  ml.dB = rows_stride<K::StrideB>(n_in, int64_t(n_out) * n_in);  // expert e's (N, K) at w + e N K
  ml.ptr_SFA = in_scales;
  ml.layout_SFA = K::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m_pad, n_out, n_in, 1));
  ml.ptr_SFB = w_scales;
  ml.layout_SFB = K::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m_pad, n_out, n_in, n_experts));
  ml.tile_expert = tile_expert;
  ml.n_experts = n_experts;
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = reinterpret_cast<K::ElementD*>(out);
  args.epilogue.dD = rows_stride<K::StrideD>(n_out, int64_t(m_pad) * n_out);
  args.scheduler.used_rows = used_rows;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

}  // namespace

size_t fp8_padded_workspace_bytes(int64_t m_pad, int64_t n_out, int64_t n_in, int sm_count) {
  auto args = padded_args(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, int(m_pad), 1, int(n_in),
                          int(n_out), 0, sm_count);
  return PaddedKernel::Gemm::get_workspace_size(args);
}

void run_fp8_padded(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                    const float* w_scales, const int32_t* tile_expert, const int32_t* used_rows, int64_t m_pad,
                    int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count, int device,
                    cudaStream_t stream) {
  const auto args = padded_args(out, in, in_scales, w, w_scales, tile_expert, used_rows, int(m_pad), int(n_experts),
                                int(n_in), int(n_out), device, sm_count);
  typename PaddedKernel::Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 padded expert GEMM: CUTLASS cannot implement ", m_pad, " rows x (",
             n_out, ", ", n_in, ") x ", n_experts, " experts: ", cutlassGetStatusString(st));
  st = gemm.initialize(args, workspace, stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 padded expert GEMM: initialize: ", cutlassGetStatusString(st));
  st = gemm.run(stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 padded expert GEMM: run: ", cutlassGetStatusString(st));
  CUDA_CHECK_LAUNCH("CUTLASS FP8 padded expert GEMM");
}

}  // namespace lfm2::cuda::grouped
