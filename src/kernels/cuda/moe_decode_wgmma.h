// The wgmma kernels of the decode expert products (moe_decode_wgmma.cuh), compiled for sm_90a
// alone in moe_decode_wgmma.cu (lfm2_kernels_cutlass) and launched by moe_experts_decode.cu on
// compute capability 9.0 only: this header hands out the kernels without any device code.
#pragma once

namespace lfm2::cuda::moe_gemm {

struct Args;
using Kernel = void (*)(Args);

// moe_gemm_kernel<T, gate_up, stages, WgmmaConsumer> for stages 4 or 6 (T: bf16 or fp16).
template <typename T>
Kernel wgmma_kernel(bool gate_up, int stages);

// Its dynamic shared memory (smem_bytes with the 1024-byte alignment's pad).
int wgmma_smem_bytes(int stages);

}  // namespace lfm2::cuda::moe_gemm
