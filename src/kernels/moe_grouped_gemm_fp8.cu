// The FP8 grouped GEMM (grouped_gemm_fp8.h) on CUTLASS's sm90 ptr-array kernel with blockwise
// scaling: one problem per expert, (M_e, N, K) = (rows of e, n_out, n_in), written on the device
// from the routing offsets as the bf16 kernel's (grouped_gemm_sm90.cuh), plus each expert's scale
// pointers and scale layouts:
//   A_e = in + offsets[e] * K            e4m3 row-major (M_e, K)
//   SFA_e = in_scales + offsets[e] * K/128   (K/128, M_e) fp32: one per (row, 128 columns)
//   B_e = W + e * N * K                  e4m3 (N, K) K-contiguous
//   SFB_e = w_scales + e * (K/128)(N/128)    (K/128, N/128): one per 128 x 128 block (block128)
//         = w_scales + e * (K/128) N         (K/128, N): one per output row and k block (channel)
//   D_e = out + offsets[e] * N           bf16 row-major (M_e, N)
// CUTLASS's grouped kernel derives the scale layouts from each problem's shape (it ignores the
// layout arguments), so per-row and per-channel scales come repeated per k block. Tiles 128 x 128 x
// 128 (one scale block deep), cooperative, cluster 1 x 2; fp32 accumulation with the scales
// applied per 128-deep block (CUTLASS's software promotion), D = acc (no C operand). Two kernels:
// weight scales per 128 output rows (block128) or per row (channel).
#include <algorithm>

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

// What the kernels share: the types, the tiles and the epilogue (D = acc as bf16).
template <class Cluster>
struct Fp8Base {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16, kAlignD = 8;  // 16-byte rows for TMA
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Cluster;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  static constexpr int kEpilogueSmem = static_cast<int>(sizeof(typename Epilogue::SharedStorage));
};

// GranN: output rows (N) per weight scale, 128 (block128) or 1 (channel).
template <int GranN, class Cluster = Shape<_1, _2, _1>>
struct Fp8Kernel : Fp8Base<Cluster> {
  using Base = Fp8Base<Cluster>;
  using typename Base::ElementA, typename Base::ElementB, typename Base::ElementD, typename Base::ProblemShape,
      typename Base::LayoutA, typename Base::LayoutB, typename Base::TileShape, typename Base::ClusterShape,
      typename Base::Epilogue;
  using Base::kAlignAB, Base::kEpilogueSmem;
  static constexpr int kGranN = GranN;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, GranN, 128>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignAB,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmem>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  static_assert(cute::is_same_v<StrideA, cute::Stride<int64_t, _1, _0>>, "A: row-major (M, K)");
  static_assert(cute::is_same_v<StrideB, cute::Stride<int64_t, _1, _0>>, "B: (N, K) with K contiguous");
  static_assert(cute::is_same_v<StrideD, cute::Stride<int64_t, _1, _0>>, "D: row-major (M, N)");
};

// The device argument arrays, each 256-byte aligned, then CUTLASS's workspace.
struct Fp8Args {
  size_t shapes, ptr_a, ptr_b, ptr_sfa, ptr_sfb, ptr_d, stride_a, stride_b, stride_d, layout_sfa, layout_sfb, total;
};

__host__ __device__ size_t align256(size_t n) { return (n + 255) / 256 * 256; }

template <class K8>
__host__ __device__ Fp8Args fp8_args(int64_t n_experts) {
  const size_t E = size_t(n_experts), p = align256(E * sizeof(void*)), s = align256(E * sizeof(int64_t));
  Fp8Args l;
  l.shapes = 0;
  l.ptr_a = align256(E * sizeof(typename K8::Shape3));
  l.ptr_b = l.ptr_a + p;
  l.ptr_sfa = l.ptr_b + p;
  l.ptr_sfb = l.ptr_sfa + p;
  l.ptr_d = l.ptr_sfb + p;
  l.stride_a = l.ptr_d + p;
  l.stride_b = l.stride_a + s;
  l.stride_d = l.stride_b + s;
  l.layout_sfa = l.stride_d + s;
  l.layout_sfb = l.layout_sfa + align256(E * sizeof(typename K8::LayoutSFA));
  l.total = l.layout_sfb + align256(E * sizeof(typename K8::LayoutSFB));
  return l;
}

template <class T>
__host__ __device__ T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

// The weight scales per K8's GranN output rows.
template <class K8>
__global__ void fp8_setup_kernel(void* ws, const int32_t* offsets, int n_experts, int n, int k,
                                 const typename K8::ElementA* a, const float* sfa, const typename K8::ElementB* b,
                                 const float* sfb, typename K8::ElementD* d) {
  using ElementA = typename K8::ElementA;
  using ElementB = typename K8::ElementB;
  using ElementD = typename K8::ElementD;
  using StrideA = typename K8::StrideA;
  using StrideB = typename K8::StrideB;
  using StrideD = typename K8::StrideD;
  using Shape3 = typename K8::Shape3;
  using LayoutSFA = typename K8::LayoutSFA;
  using LayoutSFB = typename K8::LayoutSFB;
  constexpr bool kChannel = K8::kGranN == 1;
  const Fp8Args l = fp8_args<K8>(n_experts);
  const int kb = k / 128, nb = n / 128;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const int r0 = offsets[e], m = offsets[e + 1] - r0;
    at<Shape3>(ws, l.shapes)[e] = Shape3(m, n, k);
    at<const ElementA*>(ws, l.ptr_a)[e] = a + int64_t(r0) * k;
    at<const ElementB*>(ws, l.ptr_b)[e] = b + int64_t(e) * n * k;
    at<const float*>(ws, l.ptr_sfa)[e] = sfa + int64_t(r0) * kb;
    at<const float*>(ws, l.ptr_sfb)[e] = sfb + int64_t(e) * kb * (kChannel ? n : nb);
    at<ElementD*>(ws, l.ptr_d)[e] = d + int64_t(r0) * n;
    StrideA sa{};
    StrideB sb{};
    StrideD sd{};
    cute::get<0>(sa) = k;
    cute::get<0>(sb) = k;
    cute::get<0>(sd) = n;
    at<StrideA>(ws, l.stride_a)[e] = sa;
    at<StrideB>(ws, l.stride_b)[e] = sb;
    at<StrideD>(ws, l.stride_d)[e] = sd;
    // (the grouped kernel derives the scale layouts from the shapes again; kept for its arguments)
    at<LayoutSFA>(ws, l.layout_sfa)[e] = K8::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    at<LayoutSFB>(ws, l.layout_sfb)[e] = K8::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  }
}

struct BlockSchedule {
  bool along_n = false;
  int swizzle = 1;
};
BlockSchedule& block_schedule() {
  static BlockSchedule b;
  return b;
}
using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;

template <class K8>
typename K8::Gemm::Arguments make_args(void* ws, int64_t n_experts, int device, int sm_count) {
  using ElementA = typename K8::ElementA;
  using ElementB = typename K8::ElementB;
  using ElementD = typename K8::ElementD;
  const Fp8Args l = fp8_args<K8>(n_experts);
  typename K8::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  // shapes on the device only
  args.problem_shape = {int(n_experts), at<typename K8::Shape3>(ws, l.shapes), nullptr};
  args.mainloop = {at<const ElementA*>(ws, l.ptr_a),  at<typename K8::StrideA>(ws, l.stride_a),
                   at<const ElementB*>(ws, l.ptr_b),  at<typename K8::StrideB>(ws, l.stride_b),
                   at<const float*>(ws, l.ptr_sfa),   at<typename K8::LayoutSFA>(ws, l.layout_sfa),
                   at<const float*>(ws, l.ptr_sfb),   at<typename K8::LayoutSFB>(ws, l.layout_sfb)};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = at<ElementD*>(ws, l.ptr_d);
  args.epilogue.dD = at<typename K8::StrideD>(ws, l.stride_d);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  args.scheduler.raster_order = block_schedule().along_n ? RasterOrderOptions::AlongN : RasterOrderOptions::AlongM;
  args.scheduler.max_swizzle_size = block_schedule().swizzle;
  return args;
}

template <class K8>
size_t workspace_of(int64_t n_experts, int sm_count) {
  typename K8::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), nullptr, nullptr};
  args.hw_info.sm_count = sm_count;
  return fp8_args<K8>(n_experts).total + align256(K8::Gemm::get_workspace_size(args));
}

template <class K8>
void run_kernel(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                const float* w_scales, const int32_t* offsets, int64_t n_experts, int64_t n_in, int64_t n_out,
                void* workspace, int sm_count, int device, cudaStream_t stream) {
  fp8_setup_kernel<K8><<<1, 128, 0, stream>>>(workspace, offsets, int(n_experts), int(n_out), int(n_in),
                                              reinterpret_cast<const typename K8::ElementA*>(in), in_scales,
                                              reinterpret_cast<const typename K8::ElementB*>(w), w_scales,
                                              reinterpret_cast<typename K8::ElementD*>(out));
  CUDA_CHECK_LAUNCH("FP8 grouped GEMM setup kernel");
  const typename K8::Gemm::Arguments args = make_args<K8>(workspace, n_experts, device, sm_count);
  typename K8::Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 grouped GEMM: CUTLASS cannot implement ", n_experts, " x (", n_out,
             ", ", n_in, "): ", cutlassGetStatusString(st));
  st = gemm.initialize(args, static_cast<char*>(workspace) + fp8_args<K8>(n_experts).total, stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 grouped GEMM: initialize: ", cutlassGetStatusString(st));
  st = gemm.run(stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 grouped GEMM: run: ", cutlassGetStatusString(st));
  CUDA_CHECK_LAUNCH("CUTLASS FP8 grouped GEMM");
}

// The block128 configurations: clusters of 1 x 2 (the default), 2 x 1, 1 x 1 and 2 x 2.
using B0 = Fp8Kernel<128>;
using B1 = Fp8Kernel<128, Shape<_2, _1, _1>>;
using B2 = Fp8Kernel<128, Shape<_1, _1, _1>>;
using B3 = Fp8Kernel<128, Shape<_2, _2, _1>>;
const char* const kBlockNames[kFp8BlockConfigCount] = {"coop 128x128x128 c1x2", "coop 128x128x128 c2x1",
                                                       "coop 128x128x128 c1x1", "coop 128x128x128 c2x2"};
int& forced_block() {
  static int c = -1;
  return c;
}

}  // namespace

const char* fp8_block_config_name(int config) {
  LFM2_CHECK(config >= 0 && config < kFp8BlockConfigCount, "FP8 grouped GEMM: no configuration ", config);
  return kBlockNames[config];
}

void force_fp8_block_config(int config) {
  LFM2_CHECK(config >= -1 && config < kFp8BlockConfigCount, "FP8 grouped GEMM: no configuration ", config);
  forced_block() = config;
}

void set_fp8_block_schedule(bool along_n, int swizzle) {
  LFM2_CHECK(swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8, "FP8 grouped GEMM: swizzle ", swizzle,
             " is not 1, 2, 4 or 8");
  block_schedule() = {along_n, swizzle};
}

size_t fp8_workspace_bytes(int64_t n_experts, int sm_count) {
  return std::max({workspace_of<B0>(n_experts, sm_count), workspace_of<B1>(n_experts, sm_count),
                   workspace_of<B2>(n_experts, sm_count), workspace_of<B3>(n_experts, sm_count),
                   workspace_of<Fp8Kernel<1>>(n_experts, sm_count)});
}

void run_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
             const float* w_scales, bool w_per_channel, const int32_t* offsets, int64_t n_experts, int64_t n_in,
             int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream) {
  if (w_per_channel)
    run_kernel<Fp8Kernel<1>>(out, in, in_scales, w, w_scales, offsets, n_experts, n_in, n_out, workspace,
                             sm_count, device, stream);
  else
    switch (forced_block() >= 0 ? forced_block() : kFp8BlockDefault) {
      case 0: return run_kernel<B0>(out, in, in_scales, w, w_scales, offsets, n_experts, n_in, n_out, workspace,
                                    sm_count, device, stream);
      case 1: return run_kernel<B1>(out, in, in_scales, w, w_scales, offsets, n_experts, n_in, n_out, workspace,
                                    sm_count, device, stream);
      case 2: return run_kernel<B2>(out, in, in_scales, w, w_scales, offsets, n_experts, n_in, n_out, workspace,
                                    sm_count, device, stream);
      default: return run_kernel<B3>(out, in, in_scales, w, w_scales, offsets, n_experts, n_in, n_out, workspace,
                                     sm_count, device, stream);
    }
}

}  // namespace lfm2::cuda::grouped
