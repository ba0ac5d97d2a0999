// The CUTLASS ptr-array grouped GEMM of grouped_gemm_sm90.h, as templates: included only by the
// two translation units that instantiate it (moe_grouped_gemm_bf16.cu, moe_grouped_gemm_fp16.cu),
// which are compiled for sm_90a alone (wgmma and TMA need the arch-specific target).
//
// Per expert e, one GEMM problem (M_e, N, K) = (rows of e, n_out, n_in):
//   A_e = in + offsets[e] * K   row-major (M_e, K)          the expert's gathered rows
//   B_e = W + e * N * K         column-major (K, N), i.e. W_e (N, K) row-major
//   D_e = out + offsets[e] * N  row-major (M_e, N)
// written by setup_kernel on the device; the kernel's persistent tile scheduler walks the groups
// reading those shapes (host_problem_shapes = nullptr), so empty experts cost nothing and nothing
// about the routing travels to the host. fp32 accumulation, D = acc (alpha 1, no C operand).
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/operator_epilogue.cuh"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "the grouped GEMM needs CUTLASS's sm90 ptr-array support (CUDA 12.3+)"
#endif

namespace lfm2::cuda::grouped {
namespace detail {

using namespace cute;

template <typename T>
struct CutlassElem;
template <>
struct CutlassElem<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CutlassElem<__half> {
  using type = cutlass::half_t;
};

// The epilogue of the gate/up product with SwiGLU fused: W13's rows are interleaved per expert
// (row 2j = w1 row j, row 2j + 1 = w3 row j), so output columns (2j, 2j + 1) are (gate_j, up_j), and
// in the wgmma accumulator layout a thread holds both of a pair in adjacent registers. Each thread
// writes silu(gate) * up, from the fp32 accumulators, straight to D (M, N / 2) with plain stores: no
// shared memory, no [gate | up] tensor in device memory. Used through CUTLASS's adapter for
// operator-style epilogues (Sm90TmaWarpSpecializedAdapter), with the ptr-array cooperative mainloop.
template <class Element>
class SwigluEpilogue : public OperatorEpilogueBase<Element> {
 public:
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using InternalStrideC = cute::Stride<int64_t, _1, _0>;
  using InternalStrideD = cute::Stride<int64_t, _1, _0>;
  using StrideC = InternalStrideC*;
  using StrideD = InternalStrideD*;
  struct SharedStorage {};
  using TensorMapStorage = SharedStorage;

  struct Arguments {
    Element** ptr_D = nullptr;  // per group: the (M, N / 2) output
    StrideD dD = nullptr;        // per group: its row stride (N / 2 for packed rows)
  };
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ptr_D != nullptr && args.dD != nullptr;
  }

  CUTLASS_HOST_DEVICE SwigluEpilogue(Params const& params) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    static_assert(is_static<FrgLayout>::value, "accumulator layout must be static");
    const int M = int(get<0>(problem_shape_mnkl)), N = int(get<1>(problem_shape_mnkl));
    const auto m_coord = get<0>(blk_coord_mnkl), n_coord = get<1>(blk_coord_mnkl);
    const auto l_coord = get<3>(blk_coord_mnkl);
    Element* d = reinterpret_cast<Element*>(params_.ptr_D[l_coord]);
    const int64_t ldd = get<0>(params_.dD[l_coord]);
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor coords = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_mnk),
                               make_coord(m_coord, n_coord));
    Tensor tc = thr_mma.partition_C(coords);  // (VEC, THR_M, THR_N) of (m, n)
    static_assert(decltype(size(acc))::value % 2 == 0, "pairs of accumulators");
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      const int m = get<0>(tc(i)), n = get<1>(tc(i));
      // the wgmma C layout puts columns n, n + 1 (n even) in values i, i + 1
      if (get<1>(tc(i + 1)) != n + 1 || get<0>(tc(i + 1)) != m || (n & 1)) __trap();
      if (m < M && n < N) {
        const float g = acc(i), u = acc(i + 1);
        d[int64_t(m) * ldd + (n >> 1)] = Element(g / (1.0f + expf(-g)) * u);
      }
    }
  }

 private:
  Params params_;
};

// One kernel type per (element, tile, cluster, schedule), composed from CUTLASS's builders.
template <class Element, class TileShape, class ClusterShape, class EpilogueSchedule, bool kSwiglu>
struct EpilogueFor {  // the plain epilogue: TMA stores of D = acc, no C operand
  using type = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*,
      16 / int(sizeof(Element)), Element, cutlass::layout::RowMajor*, 16 / int(sizeof(Element)), EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, float>>::CollectiveOp;
};
template <class Element, class TileShape, class ClusterShape, class EpilogueSchedule>
struct EpilogueFor<Element, TileShape, ClusterShape, EpilogueSchedule, true> {
  using type = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<SwigluEpilogue<Element>>;
};

template <typename T, int TM, int TN, int TK, int CM, int CN, bool kPingpong, bool kSwiglu = false>
struct Kernel {
  static constexpr bool kFusedSwiglu = kSwiglu;
  using Element = typename CutlassElem<T>::type;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 16 / int(sizeof(Element));  // TMA: 16-byte rows
  using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using ClusterShape = Shape<Int<CM>, Int<CN>, _1>;
  using MainloopSchedule = cute::conditional_t<kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                               cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = cute::conditional_t<kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                               cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;

  static_assert(!kSwiglu || !kPingpong, "the SwiGLU epilogue is built for the cooperative schedule");
  using CollectiveEpilogue = typename EpilogueFor<Element, TileShape, ClusterShape, EpilogueSchedule, kSwiglu>::type;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element, LayoutB*, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  // Each stride's one dynamic entry (the leading dimension) is its first mode.
  static_assert(cute::is_same_v<StrideA, cute::Stride<int64_t, _1, _0>>, "A: row-major (M, K)");
  static_assert(cute::is_same_v<StrideB, cute::Stride<int64_t, _1, _0>>, "B: (N, K) with K contiguous");
  static_assert(cute::is_same_v<StrideD, cute::Stride<int64_t, _1, _0>>, "D: row-major (M, N)");
};

// The device argument arrays, each 256-byte aligned, in one block at the start of the workspace;
// CUTLASS's workspace follows.
struct ArgLayout {
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, cutlass, total_args;
};

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline ArgLayout arg_layout(int64_t n_experts) {
  const size_t E = size_t(n_experts);
  ArgLayout l;
  l.shapes = 0;
  l.ptr_a = l.shapes + align256(E * 3 * sizeof(int));
  l.ptr_b = l.ptr_a + align256(E * sizeof(void*));
  l.ptr_d = l.ptr_b + align256(E * sizeof(void*));
  l.stride_a = l.ptr_d + align256(E * sizeof(void*));
  l.stride_b = l.stride_a + align256(E * sizeof(int64_t));
  l.stride_d = l.stride_b + align256(E * sizeof(int64_t));
  l.cutlass = l.stride_d + align256(E * sizeof(int64_t));
  l.total_args = l.cutlass;
  return l;
}

// Writes every expert's problem shape, pointers and strides from the routing offsets. D has d_cols
// columns: n, or n / 2 when the epilogue fuses SwiGLU.
template <class K>
__global__ void setup_kernel(typename K::Shape3* shapes, const typename K::Element** ptr_a,
                             const typename K::Element** ptr_b, typename K::Element** ptr_d,
                             typename K::StrideA* stride_a, typename K::StrideB* stride_b,
                             typename K::StrideD* stride_d, const int32_t* offsets, int n_experts, int n, int k,
                             int d_cols, const typename K::Element* a, const typename K::Element* b,
                             typename K::Element* d) {
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const int r0 = offsets[e], m = offsets[e + 1] - r0;
    shapes[e] = typename K::Shape3(m, n, k);
    ptr_a[e] = a + int64_t(r0) * k;
    ptr_b[e] = b + int64_t(e) * n * k;
    ptr_d[e] = d + int64_t(r0) * d_cols;
    typename K::StrideA sa{};
    typename K::StrideB sb{};
    typename K::StrideD sd{};
    cute::get<0>(sa) = k;
    cute::get<0>(sb) = k;
    cute::get<0>(sd) = d_cols;
    stride_a[e] = sa;
    stride_b[e] = sb;
    stride_d[e] = sd;
  }
}

template <class K>
size_t cutlass_workspace_bytes(int64_t n_experts, int sm_count) {
  typename K::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), nullptr, nullptr};
  args.hw_info.sm_count = sm_count;
  return K::Gemm::get_workspace_size(args);
}

template <class K, typename T>
void run_kernel(T* out, const T* in, const T* weight, const int32_t* offsets, int64_t n_experts, int64_t n_in,
                int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream) {
  using E = typename K::Element;
  const ArgLayout l = arg_layout(n_experts);
  char* ws = static_cast<char*>(workspace);
  auto* shapes = reinterpret_cast<typename K::Shape3*>(ws + l.shapes);
  auto* ptr_a = reinterpret_cast<const E**>(ws + l.ptr_a);
  auto* ptr_b = reinterpret_cast<const E**>(ws + l.ptr_b);
  auto* ptr_d = reinterpret_cast<E**>(ws + l.ptr_d);
  auto* stride_a = reinterpret_cast<typename K::StrideA*>(ws + l.stride_a);
  auto* stride_b = reinterpret_cast<typename K::StrideB*>(ws + l.stride_b);
  auto* stride_d = reinterpret_cast<typename K::StrideD*>(ws + l.stride_d);
  static_assert(sizeof(typename K::Shape3) == 3 * sizeof(int) && sizeof(typename K::StrideA) == sizeof(int64_t) &&
                    sizeof(typename K::StrideB) == sizeof(int64_t) && sizeof(typename K::StrideD) == sizeof(int64_t),
                "argument array layout");

  setup_kernel<K><<<1, 128, 0, stream>>>(shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, offsets,
                                         int(n_experts), int(n_out), int(n_in),
                                         K::kFusedSwiglu ? int(n_out / 2) : int(n_out), reinterpret_cast<const E*>(in),
                                         reinterpret_cast<const E*>(weight), reinterpret_cast<E*>(out));
  CUDA_CHECK_LAUNCH("grouped GEMM setup_kernel");

  typename K::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), shapes, nullptr};  // shapes on the device only
  args.mainloop = {ptr_a, stride_a, ptr_b, stride_b};
  if constexpr (!K::kFusedSwiglu) {
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
  }
  args.epilogue.ptr_D = ptr_d;
  args.epilogue.dD = stride_d;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;

  typename K::Gemm gemm;
  void* cutlass_ws = ws + l.cutlass;
  cutlass::Status st = gemm.can_implement(args);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "grouped GEMM: CUTLASS cannot implement ", n_experts, " x (", n_out,
             ", ", n_in, "): ", cutlassGetStatusString(st));
  st = gemm.initialize(args, cutlass_ws, stream);  // host-side: TMA descriptors, kernel attributes
  LFM2_CHECK(st == cutlass::Status::kSuccess, "grouped GEMM: initialize: ", cutlassGetStatusString(st));
  st = gemm.run(stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "grouped GEMM: run: ", cutlassGetStatusString(st));
  CUDA_CHECK_LAUNCH("CUTLASS grouped GEMM");
}

// The compiled configurations, in kGroupedTiles order, and the SwiGLU-fused gate/up products of
// the two the table uses.
template <typename T>
using Config0 = Kernel<T, 128, 128, 64, 1, 2, false>;
template <typename T>
using Config1 = Kernel<T, 256, 128, 64, 1, 2, false>;
template <typename T>
using Config2 = Kernel<T, 128, 256, 64, 1, 2, false>;
template <typename T>
using Config3 = Kernel<T, 128, 128, 64, 1, 2, true>;
template <typename T>
using Swiglu0 = Kernel<T, 128, 128, 64, 1, 2, false, true>;
template <typename T>
using Swiglu1 = Kernel<T, 256, 128, 64, 1, 2, false, true>;
static_assert(kGroupedConfigCount == 4, "one ConfigN per kGroupedTiles row");

template <typename T, typename F>
void with_config(int config, F&& f) {
  switch (config) {
    case 0: return f(Config0<T>{});
    case 1: return f(Config1<T>{});
    case 2: return f(Config2<T>{});
    case 3: return f(Config3<T>{});
    default: LFM2_FAIL("grouped GEMM: no tile configuration ", config);
  }
}

template <typename T, typename F>
void with_swiglu_config(int config, F&& f) {
  switch (config) {
    case 0: return f(Swiglu0<T>{});
    case 1: return f(Swiglu1<T>{});
    default: LFM2_FAIL("grouped GEMM: no SwiGLU-fused kernel for tile configuration ", config);
  }
}

}  // namespace detail

template <typename T>
void run(int config, T* out, const T* in, const T* weight, const int32_t* offsets, int64_t n_experts, int64_t n_in,
         int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream) {
  detail::with_config<T>(config, [&](auto k) {
    using K = decltype(k);
    detail::run_kernel<K>(out, in, weight, offsets, n_experts, n_in, n_out, workspace, sm_count, device, stream);
  });
}

template <typename T>
void run_swiglu(int config, T* act, const T* in, const T* w13, const int32_t* offsets, int64_t n_experts,
                int64_t n_in, int64_t inter, void* workspace, int sm_count, int device, cudaStream_t stream) {
  detail::with_swiglu_config<T>(config, [&](auto k) {
    using K = decltype(k);
    detail::run_kernel<K>(act, in, w13, offsets, n_experts, n_in, 2 * inter, workspace, sm_count, device, stream);
  });
}

// The workspace of the largest configuration (the same for both element types).
inline size_t workspace_bytes_impl(int64_t n_experts, int sm_count) {
  size_t cutlass_bytes = 0;
  for (int c = 0; c < kGroupedConfigCount; ++c)
    detail::with_config<__nv_bfloat16>(c, [&](auto k) {
      cutlass_bytes = std::max(cutlass_bytes, detail::cutlass_workspace_bytes<decltype(k)>(n_experts, sm_count));
    });
  for (int c : {0, 1})
    detail::with_swiglu_config<__nv_bfloat16>(c, [&](auto k) {
      cutlass_bytes = std::max(cutlass_bytes, detail::cutlass_workspace_bytes<decltype(k)>(n_experts, sm_count));
    });
  return detail::arg_layout(n_experts).total_args + detail::align256(cutlass_bytes);
}

}  // namespace lfm2::cuda::grouped
