// The sm_90a instantiations of the FP8 x FP8 decode products on wgmma (kernels/cuda/fp8_wgmma.h).
#include "kernels/cuda/fp8_wgmma.h"
#include "kernels/cuda/moe_decode_wgmma_fp8.cuh"

namespace lfm2::cuda {

namespace {
template <int XR>
Fp8WgmmaKernel kernel_of(bool gate_up) {
  namespace w8 = moe_wgmma_fp8;
  return {gate_up ? w8::moe_wgmma_fp8_kernel<true, XR> : w8::moe_wgmma_fp8_kernel<false, XR>, w8::Shape<XR>::kSmem};
}
}  // namespace

Fp8WgmmaKernel moe_wgmma_fp8_kernel(bool gate_up, int xr) {
  return xr <= 8 ? kernel_of<8>(gate_up) : xr <= 16 ? kernel_of<16>(gate_up) : xr <= 32 ? kernel_of<32>(gate_up)
                                                                                      : kernel_of<64>(gate_up);
}

}  // namespace lfm2::cuda
