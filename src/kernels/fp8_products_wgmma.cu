// The sm_90a instantiations of the FP8 x FP8 decode products on wgmma (kernels/cuda/fp8_wgmma.h).
#include "kernels/cuda/fp8_wgmma.h"
#include "kernels/cuda/moe_decode_wgmma_fp8.cuh"

namespace lfm2::cuda {

namespace {
template <int XR, int BPS = 1>
Fp8WgmmaKernel kernel_of(bool gate_up) {
  namespace w8 = moe_wgmma_fp8;
  return {gate_up ? w8::moe_wgmma_fp8_kernel<true, XR, BPS> : w8::moe_wgmma_fp8_kernel<false, XR, BPS>,
          w8::Shape<XR, BPS>::kSmem, BPS};
}
}  // namespace

Fp8WgmmaKernel moe_wgmma_fp8_kernel(bool gate_up, int xr, int bps) {
  if (bps == 2 && xr <= 32)  // 64 slots hold more than 128 registers a thread: one block an SM
    return xr <= 8 ? kernel_of<8, 2>(gate_up) : xr <= 16 ? kernel_of<16, 2>(gate_up) : kernel_of<32, 2>(gate_up);
  return xr <= 8 ? kernel_of<8>(gate_up) : xr <= 16 ? kernel_of<16>(gate_up) : xr <= 32 ? kernel_of<32>(gate_up)
                                                                                      : kernel_of<64>(gate_up);
}

}  // namespace lfm2::cuda
