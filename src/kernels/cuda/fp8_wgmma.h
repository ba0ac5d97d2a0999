// The FP8 x FP8 decode expert products on wgmma (kernels/cuda/moe_decode_wgmma_fp8.cuh), built for
// sm_90a alone in fp8_products_wgmma.cu (lfm2_kernels_cutlass): fp8_products.cu launches them on
// compute capability 9.0 only.
#pragma once

namespace lfm2::cuda {

namespace moe_gemm_fp8 {
struct Args;
}

// The kernel (gate/up or down) for a token tile of xr rows (8, 16, 32 or 64), its dynamic shared
// memory and blocks an SM: bps 2 asks for two (half the stages each; up to 32 rows), else one.
struct Fp8WgmmaKernel {
  void (*fn)(moe_gemm_fp8::Args);
  int smem;
  int bps;
};
Fp8WgmmaKernel moe_wgmma_fp8_kernel(bool gate_up, int xr, int bps = 1);

}  // namespace lfm2::cuda
