// The sm_90a instantiations of the FP8 x FP8 decode products on wgmma (kernels/cuda/fp8_wgmma.h).
#include "kernels/cuda/fp8_wgmma.h"
#include "kernels/cuda/moe_decode_wgmma_fp8.cuh"

namespace lfm2::cuda {

Fp8WgmmaKernel moe_wgmma_fp8_kernel(bool gate_up) {
  namespace w8 = moe_wgmma_fp8;
  return {gate_up ? reinterpret_cast<const void*>(w8::moe_wgmma_fp8_kernel<true>)
                  : reinterpret_cast<const void*>(w8::moe_wgmma_fp8_kernel<false>),
          w8::kSmem};
}

}  // namespace lfm2::cuda
