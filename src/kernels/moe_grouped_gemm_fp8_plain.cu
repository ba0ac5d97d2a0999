// The channel scheme's FP8 grouped GEMM (grouped_gemm_fp8.h: moe_grouped_matmul_fp8_raw) on
// CUTLASS's plain sm90 ptr-array FP8 kernel: e4m3 x e4m3 with fp32 accumulation (the FP8 mainloop
// that promotes the wgmma partial sums into a second fp32 accumulator every 4 k blocks, not the
// FastAccum one), no scales in the mainloop or the epilogue: D = the raw sum as bf16. Per-row and
// per-output-row scales factor out of the sum, so the consumers apply them (the SwiGLU's
// quantization, the combine). One problem per expert, written on the device from the offsets:
//   A_e = in + offsets[e] * K   e4m3 row-major (M_e, K)
//   B_e = W + e * N * K         e4m3 (N, K) K-contiguous
//   D_e = out + offsets[e] * N  bf16 row-major (M_e, N)
// Tile configurations (kFp8PlainConfigCount, named by fp8_plain_config_name) are instantiated here;
// the launcher uses kFp8PlainDefault (128 x 128 x 256, cluster 1 x 2) unless the bench forces one.
#include <algorithm>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
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

template <class Tile, class Cluster, class KernelSchedule, class EpilogueSchedule>
struct PlainKernel {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16, kAlignD = 8;  // 16-byte rows for TMA
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignAB, ElementB, LayoutB*,
      kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
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

using Coop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
using CoopFast = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum;

// The tile configurations (the non-fast-accum mainloop keeps two fp32 accumulators, so a consumer
// warp group's tile stays at 64 x 128: 128 x 128 cooperative). H100, helper CH8's call 2, both
// products at 4,096 / 8,192 / 16,384 tokens x top-4, routed: 128 x 128 x 256, cluster 1 x 2 (the
// default) 0.407 / 0.692 / 1.232 ms; 128 x 128 x 128 0.407 / 0.704 / 1.292; its cluster 1 x 1
// 0.442 / 0.764 / 1.426; call 1: 64 x 128 ping-pong 0.546 / 0.974 / 1.817, cluster 2 x 1 0.468 /
// 0.769 / 1.389. The last one, FastAccum (the sums kept in the tensor core's own precision between
// promotions: not shipped), is a timing comparison only: 0.351 / 0.616 / 1.086.
using K0 = PlainKernel<Shape<_128, _128, _128>, Shape<_1, _2, _1>, Coop, CoopEpi>;
using K1 = PlainKernel<Shape<_128, _128, _256>, Shape<_1, _2, _1>, Coop, CoopEpi>;
using K2 = PlainKernel<Shape<_128, _128, _128>, Shape<_1, _1, _1>, Coop, CoopEpi>;
using K3 = PlainKernel<Shape<_128, _256, _128>, Shape<_1, _2, _1>, CoopFast, CoopEpi>;

const char* const kNames[kFp8PlainConfigCount] = {"coop 128x128x128 c1x2", "coop 128x128x256 c1x2",
                                                  "coop 128x128x128 c1x1", "FASTACCUM coop 128x256 c1x2"};

// The device argument arrays, each 256-byte aligned, then CUTLASS's workspace.
struct PlainArgs {
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, total;
};

__host__ __device__ size_t align256(size_t n) { return (n + 255) / 256 * 256; }

template <class K8>
__host__ __device__ PlainArgs plain_args(int64_t n_experts) {
  const size_t E = size_t(n_experts), p = align256(E * sizeof(void*)), s = align256(E * sizeof(int64_t));
  PlainArgs l;
  l.shapes = 0;
  l.ptr_a = align256(E * sizeof(typename K8::Shape3));
  l.ptr_b = l.ptr_a + p;
  l.ptr_d = l.ptr_b + p;
  l.stride_a = l.ptr_d + p;
  l.stride_b = l.stride_a + s;
  l.stride_d = l.stride_b + s;
  l.total = l.stride_d + s;
  return l;
}

template <class T>
__host__ __device__ T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

template <class K8>
__global__ void plain_setup_kernel(void* ws, const int32_t* offsets, int n_experts, int n, int k,
                                   const typename K8::ElementA* a, const typename K8::ElementB* b,
                                   typename K8::ElementD* d) {
  const PlainArgs l = plain_args<K8>(n_experts);
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const int r0 = offsets[e], m = offsets[e + 1] - r0;
    at<typename K8::Shape3>(ws, l.shapes)[e] = typename K8::Shape3(m, n, k);
    at<const typename K8::ElementA*>(ws, l.ptr_a)[e] = a + int64_t(r0) * k;
    at<const typename K8::ElementB*>(ws, l.ptr_b)[e] = b + int64_t(e) * n * k;
    at<typename K8::ElementD*>(ws, l.ptr_d)[e] = d + int64_t(r0) * n;
    typename K8::StrideA sa{};
    typename K8::StrideB sb{};
    typename K8::StrideD sd{};
    cute::get<0>(sa) = k;
    cute::get<0>(sb) = k;
    cute::get<0>(sd) = n;
    at<typename K8::StrideA>(ws, l.stride_a)[e] = sa;
    at<typename K8::StrideB>(ws, l.stride_b)[e] = sb;
    at<typename K8::StrideD>(ws, l.stride_d)[e] = sd;
  }
}

template <class K8>
typename K8::Gemm::Arguments make_args(void* ws, int64_t n_experts, int device, int sm_count) {
  const PlainArgs l = plain_args<K8>(n_experts);
  typename K8::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), at<typename K8::Shape3>(ws, l.shapes), nullptr};  // on the device only
  args.mainloop.ptr_A = at<const typename K8::ElementA*>(ws, l.ptr_a);
  args.mainloop.dA = at<typename K8::StrideA>(ws, l.stride_a);
  args.mainloop.ptr_B = at<const typename K8::ElementB*>(ws, l.ptr_b);
  args.mainloop.dB = at<typename K8::StrideB>(ws, l.stride_b);
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = at<typename K8::ElementD*>(ws, l.ptr_d);
  args.epilogue.dD = at<typename K8::StrideD>(ws, l.stride_d);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  return args;
}

template <class K8>
size_t workspace_of(int64_t n_experts, int sm_count) {
  typename K8::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(n_experts), nullptr, nullptr};
  args.hw_info.sm_count = sm_count;
  return plain_args<K8>(n_experts).total + align256(K8::Gemm::get_workspace_size(args));
}

template <class K8>
void run_kernel(__nv_bfloat16* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets, int64_t n_experts,
                int64_t n_in, int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream) {
  plain_setup_kernel<K8><<<1, 128, 0, stream>>>(workspace, offsets, int(n_experts), int(n_out), int(n_in),
                                                reinterpret_cast<const typename K8::ElementA*>(in),
                                                reinterpret_cast<const typename K8::ElementB*>(w),
                                                reinterpret_cast<typename K8::ElementD*>(out));
  CUDA_CHECK_LAUNCH("FP8 plain grouped GEMM setup kernel");
  const typename K8::Gemm::Arguments args = make_args<K8>(workspace, n_experts, device, sm_count);
  typename K8::Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 plain grouped GEMM: CUTLASS cannot implement ", n_experts,
             " x (", n_out, ", ", n_in, "): ", cutlassGetStatusString(st));
  st = gemm.initialize(args, static_cast<char*>(workspace) + plain_args<K8>(n_experts).total, stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 plain grouped GEMM: initialize: ", cutlassGetStatusString(st));
  st = gemm.run(stream);
  LFM2_CHECK(st == cutlass::Status::kSuccess, "FP8 plain grouped GEMM: run: ", cutlassGetStatusString(st));
  CUDA_CHECK_LAUNCH("CUTLASS FP8 plain grouped GEMM");
}

int& forced_plain() {
  static int c = -1;
  return c;
}

}  // namespace

const char* fp8_plain_config_name(int config) {
  LFM2_CHECK(config >= 0 && config < kFp8PlainConfigCount, "FP8 plain grouped GEMM: no configuration ", config);
  return kNames[config];
}

void force_fp8_plain_config(int config) {
  LFM2_CHECK(config >= -1 && config < kFp8PlainConfigCount, "FP8 plain grouped GEMM: no configuration ", config);
  forced_plain() = config;
}

size_t fp8_plain_workspace_bytes(int64_t n_experts, int sm_count) {
  return std::max({workspace_of<K0>(n_experts, sm_count), workspace_of<K1>(n_experts, sm_count),
                   workspace_of<K2>(n_experts, sm_count), workspace_of<K3>(n_experts, sm_count)});
}

void run_fp8_plain(__nv_bfloat16* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets,
                   int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count, int device,
                   cudaStream_t stream) {
  const int c = forced_plain() >= 0 ? forced_plain() : kFp8PlainDefault;
  switch (c) {
    case 0: return run_kernel<K0>(out, in, w, offsets, n_experts, n_in, n_out, workspace, sm_count, device, stream);
    case 1: return run_kernel<K1>(out, in, w, offsets, n_experts, n_in, n_out, workspace, sm_count, device, stream);
    case 2: return run_kernel<K2>(out, in, w, offsets, n_experts, n_in, n_out, workspace, sm_count, device, stream);
    default: return run_kernel<K3>(out, in, w, offsets, n_experts, n_in, n_out, workspace, sm_count, device, stream);
  }
}

}  // namespace lfm2::cuda::grouped
