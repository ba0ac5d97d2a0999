// The sm_90a instantiations of the decode expert products' wgmma consumer (moe_decode_wgmma.cuh):
// bf16 and fp16, gate/up and down, 4 and 6 stages (variants 10 and 9 of moe_experts_decode.cu), and
// both in one grid (moe_decode_fused.cuh: variants 14 and 13).
#include "kernels/cuda/moe_decode_fused.cuh"
#include "kernels/cuda/moe_decode_wgmma.cuh"
#include "kernels/cuda/moe_decode_wgmma.h"

namespace lfm2::cuda::moe_gemm {

template <typename T>
Kernel wgmma_kernel(bool gate_up, int stages) {
  if (gate_up)
    return stages == 4 ? moe_gemm_kernel<T, true, 4, WgmmaConsumer<T, true>>
                       : moe_gemm_kernel<T, true, 6, WgmmaConsumer<T, true>>;
  return stages == 4 ? moe_gemm_kernel<T, false, 4, WgmmaConsumer<T, false>>
                     : moe_gemm_kernel<T, false, 6, WgmmaConsumer<T, false>>;
}

int wgmma_smem_bytes(int stages) { return smem_bytes(stages, WgmmaConsumer<__half, true>::kPad); }

template <typename T>
FusedKernel fused_kernel(int stages) {
  return stages == 4 ? moe_fused_kernel<T, 4> : moe_fused_kernel<T, 6>;
}

template Kernel wgmma_kernel<__nv_bfloat16>(bool, int);
template Kernel wgmma_kernel<__half>(bool, int);
template FusedKernel fused_kernel<__nv_bfloat16>(int);
template FusedKernel fused_kernel<__half>(int);

}  // namespace lfm2::cuda::moe_gemm
