// The FP8 grouped GEMM (grouped_gemm_fp8.h) on CUTLASS's sm90 ptr-array kernel with blockwise
// scaling: one problem per expert, (M_e, N, K) = (rows of e, n_out, n_in), written on the device
// from the routing offsets as the bf16 kernel's (grouped_gemm_sm90.cuh), plus each expert's scale
// pointers and scale layouts:
//   A_e = in + offsets[e] * K            e4m3 row-major (M_e, K)
//   SFA_e = in_scales + offsets[e] * K/128   (K/128, M_e) fp32: one per (row, 128 columns)
//   B_e = W + e * N * K                  e4m3 (N, K) K-contiguous
//   SFB_e = w_scales + e * (K/128)(N/128)    (K/128, N/128): one per 128 x 128 block
//   D_e = out + offsets[e] * N           bf16 row-major (M_e, N)
// Tiles 128 x 128 x 128 (one scale block deep), cooperative, cluster 1 x 2; fp32 accumulation with
// the scales applied per 128-deep block (CUTLASS's software promotion), D = acc (no C operand).
#include <cuda_runtime.h>

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
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/grouped_gemm_fp8.h"

namespace lfm2::cuda::grouped {
namespace {

using namespace cute;

struct Fp8Kernel {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16, kAlignD = 8;  // 16-byte rows for TMA
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_1, _2, _1>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  static_assert(cute::is_same_v<StrideA, cute::Stride<int64_t, _1, _0>>, "A: row-major (M, K)");
  static_assert(cute::is_same_v<StrideB, cute::Stride<int64_t, _1, _0>>, "B: (N, K) with K contiguous");
  static_assert(cute::is_same_v<StrideD, cute::Stride<int64_t, _1, _0>>, "D: row-major (M, N)");
};
using K8 = Fp8Kernel;

// The device argument arrays, each 256-byte aligned, then CUTLASS's workspace.
struct Fp8Args {
  size_t shapes, ptr_a, ptr_b, ptr_sfa, ptr_sfb, ptr_d, stride_a, stride_b, stride_d, layout_sfa, layout_sfb, total;
};

__host__ __device__ size_t align256(size_t n) { return (n + 255) / 256 * 256; }

__host__ __device__ Fp8Args fp8_args(int64_t n_experts) {
  const size_t E = size_t(n_experts), p = align256(E * sizeof(void*)), s = align256(E * sizeof(int64_t));
  Fp8Args l;
  l.shapes = 0;
  l.ptr_a = align256(E * sizeof(K8::Shape3));
  l.ptr_b = l.ptr_a + p;
  l.ptr_sfa = l.ptr_b + p;
  l.ptr_sfb = l.ptr_sfa + p;
  l.ptr_d = l.ptr_sfb + p;
  l.stride_a = l.ptr_d + p;
  l.stride_b = l.stride_a + s;
  l.stride_d = l.stride_b + s;
  l.layout_sfa = l.stride_d + s;
  l.layout_sfb = l.layout_sfa + align256(E * sizeof(K8::LayoutSFA));
  l.total = l.layout_sfb + align256(E * sizeof(K8::LayoutSFB));
  return l;
}

template <class T>
__host__ __device__ T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

__global__ void fp8_setup_kernel(void* ws, const int32_t* offsets, int n_experts, int n, int k,
                                 const K8::ElementA* a, const float* sfa, const K8::ElementB* b, const float* sfb,
                                 K8::ElementD* d) {
  const Fp8Args l = fp8_args(n_experts);
  const int kb = k / 128, nb = n / 128;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const int r0 = offsets[e], m = offsets[e + 1] - r0;
    at<K8::Shape3>(ws, l.shapes)[e] = K8::Shape3(m, n, k);
    at<const K8::ElementA*>(ws, l.ptr_a)[e] = a + int64_t(r0) * k;
    at<const K8::ElementB*>(ws, l.ptr_b)[e] = b + int64_t(e) * n * k;
    at<const float*>(ws, l.ptr_sfa)[e] = sfa + int64_t(r0) * kb;
    at<const float*>(ws, l.ptr_sfb)[e] = sfb + int64_t(e) * kb * nb;
    at<K8::ElementD*>(ws, l.ptr_d)[e] = d + int64_t(r0) * n;
    K8::StrideA sa{};
    K8::StrideB sb{};
    K8::StrideD sd{};
    cute::get<0>(sa) = k;
    cute::get<0>(sb) = k;
    cute::get<0>(sd) = n;
    at<K8::StrideA>(ws, l.stride_a)[e] = sa;
    at<K8::StrideB>(ws, l.stride_b)[e] = sb;
    at<K8::StrideD>(ws, l.stride_d)[e] = sd;
    at<K8::LayoutSFA>(ws, l.layout_sfa)[e] = K8::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    at<K8::LayoutSFB>(ws, l.layout_sfb)[e] = K8::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  }
}

typename K8::Gemm::Arguments make_args(void* ws, int64_t n_experts, int device, int sm_count) {
  const Fp8Args l = fp8_args(n_experts);
  typename K8::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), at<K8::Shape3>(ws, l.shapes), nullptr};  // shapes on the device only
  args.mainloop = {at<const K8::ElementA*>(ws, l.ptr_a),  at<K8::StrideA>(ws, l.stride_a),
                   at<const K8::ElementB*>(ws, l.ptr_b),  at<K8::StrideB>(ws, l.stride_b),
                   at<const float*>(ws, l.ptr_sfa),       at<K8::LayoutSFA>(ws, l.layout_sfa),
                   at<const float*>(ws, l.ptr_sfb),       at<K8::LayoutSFB>(ws, l.layout_sfb)};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = at<K8::ElementD*>(ws, l.ptr_d);
  args.epilogue.dD = at<K8::StrideD>(ws, l.stride_d);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

}  // namespace

size_t fp8_workspace_bytes(int64_t n_experts, int sm_count) {
  typename K8::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), nullptr, nullptr};
  args.hw_info.sm_count = sm_count;
  return fp8_args(n_experts).total + align256(K8::Gemm::get_workspace_size(args));
}

void run_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w, const float* w_scales,
             const int32_t* offsets, int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count,
             int device, cudaStream_t stream) {
  fp8_setup_kernel<<<1, 128, 0, stream>>>(workspace, offsets, int(n_experts), int(n_out), int(n_in),
                                          reinterpret_cast<const K8::ElementA*>(in), in_scales,
                                          reinterpret_cast<const K8::ElementB*>(w), w_scales,
                                          reinterpret_cast<K8::ElementD*>(out));
  CUDA_CHECK_LAUNCH("FP8 grouped GEMM setup kernel");
  const typename K8::Gemm::Arguments args = make_args(workspace, n_experts, device, sm_count);
  typename K8::Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 grouped GEMM: CUTLASS cannot implement ", n_experts, " x (", n_out,
             ", ", n_in, "): ", cutlassGetStatusString(st));
  st = gemm.initialize(args, static_cast<char*>(workspace) + fp8_args(n_experts).total, stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 grouped GEMM: initialize: ", cutlassGetStatusString(st));
  st = gemm.run(stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 grouped GEMM: run: ", cutlassGetStatusString(st));
  CUDA_CHECK_LAUNCH("CUTLASS FP8 grouped GEMM");
}

}  // namespace lfm2::cuda::grouped
