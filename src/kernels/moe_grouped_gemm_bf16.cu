// The bf16 instantiation of the CUTLASS sm90 grouped GEMM (grouped_gemm_sm90.cuh): every tile
// configuration of kGroupedTiles and the SwiGLU-fused gate/up products, in this one translation unit
// (compiled for sm_90a only), and the workspace size (the same for both element types).
#include "kernels/cuda/grouped_gemm_sm90.cuh"

namespace lfm2::cuda::grouped {

template void run<__nv_bfloat16>(int, __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*,
                                 int64_t, int64_t, int64_t, void*, int, int, cudaStream_t);
template void run_swiglu<__nv_bfloat16>(int, __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                        const int32_t*, int64_t, int64_t, int64_t, void*, int, int, cudaStream_t);

size_t workspace_bytes(int64_t n_experts, int sm_count) { return workspace_bytes_impl(n_experts, sm_count); }

}  // namespace lfm2::cuda::grouped
