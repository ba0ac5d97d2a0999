// Device-side helpers shared by the CUDA kernels: element conversions to and from fp32, warp /
// block reductions, grid sizes, the 16-byte alignment check, the launch with programmatic dependent
// launch and the persistent grids' launch on it. Header-only, included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/cuda_check.h"
#include "kernels/cuda/device_info.h"

namespace lfm2::cuda {

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` is 32 floats of shared memory; the sum order is fixed, so results repeat.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? scratch[lane] : 0.f;
  return warp_sum(t);
}

__device__ __forceinline__ float silu_f32(float g) { return g / (1.f + __expf(-g)); }

}  // namespace lfm2::cuda

// Instantiates MACRO(T) for the three element types.
#define LFM2_FOR_EACH_T(MACRO) \
  MACRO(float)                 \
  MACRO(__nv_bfloat16)         \
  MACRO(__half)

namespace lfm2::cuda {
// Whether a pointer is 16-byte aligned (vectorised loads and cp.async; the launchers' checks).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Grid size for n items at `per_block` items a block, capped to stay within gridDim.x limits
// (kernels loop grid-stride).
inline unsigned grid_for(int64_t n, int per_block) {
  int64_t g = (n + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > (int64_t(1) << 30)) g = int64_t(1) << 30;
  return unsigned(g);
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch when `pdl`:
// the kernel may start while the one before it on the stream drains, and waits for it
// (cudaGridDependencySynchronize) only where it reads that one's output.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// A persistent grid of `threads`-thread blocks, at most ctas_per_sm an SM (of compute_sms) and at
// most max_units blocks, so that every block is resident at once (the decode products' first units
// by block index and the fused grid's waits rely on it), launched with PDL; at two or more blocks an
// SM the kernel prefers all of the SM's memory as shared, so that they fit.
template <typename A>
void launch_resident(void (*kernel)(A), const A& a, int threads, int smem, int64_t max_units, int ctas_per_sm,
                     cudaStream_t stream, const char* what) {
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem);
  if (ctas_per_sm > 1) prefer_all_shared(reinterpret_cast<const void*>(kernel));
  const int64_t sms = compute_sms(current_device());
  const int64_t grid = max_units < sms * ctas_per_sm ? max_units : sms * ctas_per_sm;
  launch_pdl(kernel, dim3(unsigned(grid > 1 ? grid : 1)), dim3(unsigned(threads)), size_t(smem), stream, true, a);
  CUDA_CHECK_LAUNCH(what);
}

}  // namespace lfm2::cuda
