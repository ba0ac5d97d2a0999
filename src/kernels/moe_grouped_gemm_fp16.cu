// The fp16 instantiation of the CUTLASS sm90 grouped GEMM (grouped_gemm_sm90.cuh): every tile
// configuration of kGroupedTiles and the SwiGLU-fused gate/up products, in this one translation unit
// (compiled for sm_90a only).
#include "kernels/cuda/grouped_gemm_sm90.cuh"

namespace lfm2::cuda::grouped {

template void run<__half>(int, __half*, const __half*, const __half*, const int32_t*, int64_t, int64_t, int64_t,
                          void*, int, int, cudaStream_t);
template void run_swiglu<__half>(int, __half*, const __half*, const __half*, const int32_t*, int64_t, int64_t,
                                 int64_t, void*, int, int, cudaStream_t);

}  // namespace lfm2::cuda::grouped
