// The FP8 experts' product over rows padded per expert (grouped_gemm_fp8.h:
// moe_grouped_matmul_fp8_padded): ONE GEMM of CUTLASS's sm90 blockwise-scaled kernel (not the
// ptr-array one) over every expert's rows, A (m_pad, K) with each expert's rows starting at a
// multiple of the 128-row tile, and the weights (E, N, K) as a batch of E matrices of which each M
// tile reads the one that tile_expert names. CUTLASS's grouped kernel switches TMA descriptors
// whenever a CTA's next tile is in another group (nearly every tile here: 32 experts, one wave of
// 132 tiles); this one uses the same descriptors for every tile. The mainloop is CUTLASS's,
// wrapped (PaddedMainloop over OverlappedPromotion, which overlaps each k tile's promotion with the
// next tile's wgmmas) so that the batch coordinate of a tile is its expert for B and its
// scales while A and A's scales ignore it: one matrix of all rows. Same tile (128 x 128 x 128),
// promotion per 128-deep block and epilogue as the grouped kernel, so the same sums. The tiles past
// the rows the routing uses are skipped (PaddedTileScheduler, or PaddedDynamicScheduler: units
// drawn from a counter, the default). All in padded_gemm_sm90.cuh and its includes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/padded_gemm_sm90.cuh"

namespace lfm2::cuda::grouped {
namespace {

using namespace cute;

// The product's epilogue: D = acc in bf16 by TMA stores (no C operand).
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, padded::Tile, padded::Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 8,
    cutlass::bfloat16_t, cutlass::layout::RowMajor, 8, cutlass::epilogue::TmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<cutlass::bfloat16_t, float>>::CollectiveOp;
using Static = padded::PaddedGemm<Epilogue, false>;
using Dynamic = padded::PaddedGemm<Epilogue, false, true>;

template <class Kernel>
typename Kernel::Arguments padded_args(__nv_bfloat16* out, const uint8_t* in, const float* in_scales,
                                       const uint8_t* w, const float* w_scales, const int32_t* tile_expert,
                                       const int32_t* used_rows, int m_pad, int n_experts, int n_in, int n_out,
                                       int device, int sm_count) {
  auto args = Kernel::arguments(in, in_scales, w, w_scales, tile_expert, used_rows, m_pad, n_experts, n_in, n_out,
                                device, sm_count);
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = reinterpret_cast<cutlass::bfloat16_t*>(out);
  args.epilogue.dD = padded::rows_stride<typename Kernel::GemmKernel::StrideD>(n_out, int64_t(m_pad) * n_out);
  return args;
}

template <class Kernel>
size_t workspace_bytes(int64_t m_pad, int64_t n_out, int64_t n_in, int sm_count) {
  return Kernel::Gemm::get_workspace_size(padded_args<Kernel>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                              nullptr, int(m_pad), 1, int(n_in), int(n_out), 0,
                                                              sm_count));
}

template <class Kernel>
void run(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w, const float* w_scales,
         const int32_t* tile_expert, const int32_t* used_rows, int64_t m_pad, int64_t n_experts, int64_t n_in,
         int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream) {
  Kernel::run(padded_args<Kernel>(out, in, in_scales, w, w_scales, tile_expert, used_rows, int(m_pad),
                                  int(n_experts), int(n_in), int(n_out), device, sm_count),
              workspace, stream, "FP8 padded expert GEMM");
}

}  // namespace

size_t fp8_padded_workspace_bytes(int64_t m_pad, int64_t n_out, int64_t n_in, int sm_count) {
  return std::max(workspace_bytes<Static>(m_pad, n_out, n_in, sm_count),
                  workspace_bytes<Dynamic>(m_pad, n_out, n_in, sm_count));
}

void run_fp8_padded(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                    const float* w_scales, const int32_t* tile_expert, const int32_t* used_rows, int64_t m_pad,
                    int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, int sm_count, int device,
                    cudaStream_t stream) {
  (fp8_padded_dynamic() ? run<Dynamic> : run<Static>)(out, in, in_scales, w, w_scales, tile_expert, used_rows, m_pad,
                                                      n_experts, n_in, n_out, workspace, sm_count, device, stream);
}

}  // namespace lfm2::cuda::grouped
