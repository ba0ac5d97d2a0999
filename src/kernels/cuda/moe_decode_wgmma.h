// The wgmma kernels of the decode expert products (moe_decode_wgmma.cuh), compiled for sm_90a
// alone in moe_decode_wgmma.cu (lfm2_kernels_cutlass) and launched by moe_experts_decode.cu on
// compute capability 9.0 only: this header hands out the kernels without any device code.
#pragma once

namespace lfm2::cuda::moe_gemm {

struct Args;
struct FusedArgs;
using Kernel = void (*)(Args);
using FusedKernel = void (*)(FusedArgs);

// moe_gemm_kernel<T, gate_up, stages, WgmmaConsumer> for stages 4 or 6 (T: bf16 or fp16).
template <typename T>
Kernel wgmma_kernel(bool gate_up, int stages);

// Its dynamic shared memory (smem_bytes with the 1024-byte alignment's pad); the fused kernel's too.
int wgmma_smem_bytes(int stages);

// moe_fused_kernel<T, stages> (moe_decode_fused.cuh: gate/up and down in one grid), stages 4 or 6.
template <typename T>
FusedKernel fused_kernel(int stages);

}  // namespace lfm2::cuda::moe_gemm
