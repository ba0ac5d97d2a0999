// The FP8 grouped GEMM's launchers (grouped_gemm_fp8.h): the e4m3 quantization of expert-ordered
// rows with one scale per (row, 128 columns), and the checked call into the CUTLASS kernel
// (moe_grouped_gemm_fp8.cu). Not yet used by the stage (issue 23's prefill).
#include <cuda_fp8.h>

#include "common/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm_fp8.h"

namespace lfm2::cuda {
namespace {

constexpr int kGroup = 128;          // columns per scale
constexpr float kE4m3MaxF = 448.0f;  // largest finite e4m3
constexpr int kWarpsPerBlock = 8;

// One warp per (row, group of 128 columns), 4 columns a lane: amax by a warp reduction, s =
// amax / 448 (amax 0: 1), q = e4m3(x / s) rounded to nearest even and saturating (the hardware
// conversion; fp8_quantize's rule). The row's expert from the offsets (binary search) places its
// scale at scales + offsets[e] * G + g * M_e + (row - offsets[e]), G = cols / 128.
template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    quantize_e4m3_kernel(uint8_t* q, float* scales, const T* x, const int32_t* offsets, int64_t n_rows,
                         int n_experts, int64_t cols) {
  const int64_t G = cols / kGroup, item = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= n_rows * G) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = item / G, g = item - row * G, c = g * kGroup + lane * 4;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = to_f32(x[row * cols + c + j]);
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax > 0 ? amax / kE4m3MaxF : 1.0f;
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    packed |= uint32_t(__nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3)) << (8 * j);
  *reinterpret_cast<uint32_t*>(q + row * cols + c) = packed;
  if (lane == 0) {
    int lo = 0, hi = n_experts - 1;  // the last expert whose first row is <= row
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (offsets[mid] <= row)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t r0 = offsets[lo], m = offsets[lo + 1] - r0;
    if (row - r0 < m) scales[r0 * G + g * m + (row - r0)] = s;  // rows past the last expert have none
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
void moe_quantize_e4m3(uint8_t* q, float* scales, const T* x, const int32_t* offsets, int64_t n_rows,
                       int64_t n_experts, int64_t cols, cudaStream_t stream) {
  LFM2_CHECK(cols > 0 && cols % kGroup == 0, "moe_quantize_e4m3: ", cols, " columns (a multiple of 128)");
  LFM2_CHECK(n_experts >= 1 && n_experts < (int64_t(1) << 31), "moe_quantize_e4m3: ", n_experts, " experts");
  LFM2_CHECK(aligned16(q) && aligned16(x), "moe_quantize_e4m3: 16-byte aligned rows");
  const int64_t items = n_rows * (cols / kGroup);
  if (items == 0) return;
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  LFM2_CHECK(blocks < (int64_t(1) << 31), "moe_quantize_e4m3: ", n_rows, " rows is too many for one launch");
  quantize_e4m3_kernel<T><<<unsigned(blocks), kWarpsPerBlock * 32, 0, stream>>>(q, scales, x, offsets, n_rows,
                                                                                int(n_experts), cols);
  CUDA_CHECK_LAUNCH("quantize_e4m3_kernel");
}

int64_t moe_grouped_matmul_fp8_workspace_bytes(int64_t n_experts) {
  return int64_t(grouped::fp8_workspace_bytes(n_experts, compute_sms(current_device())));
}

void moe_grouped_matmul_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, const int32_t* offsets, int64_t max_rows, int64_t n_experts,
                            int64_t n_in, int64_t n_out, void* workspace, cudaStream_t stream) {
  if (max_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_experts >= 1 && n_in % 128 == 0 && n_out % 128 == 0 && n_in > 0 && n_in < (int64_t(1) << 31) &&
                 n_out < (int64_t(1) << 31) && max_rows < (int64_t(1) << 31),
             "moe_grouped_matmul_fp8: ", max_rows, " rows, ", n_experts, " experts, ", n_in, " -> ", n_out,
             " (n_in, n_out multiples of 128)");
  const int device = current_device();
  const DeviceInfo& info = device_info(device);
  LFM2_CHECK(info.major == 9 && info.minor == 0, "moe_grouped_matmul_fp8: built for Hopper (sm_90a); device ", device,
             " is sm_", info.major, info.minor);
  LFM2_CHECK(aligned16(in) && aligned16(w) && aligned16(out) && aligned16(workspace) &&
                 reinterpret_cast<uintptr_t>(in_scales) % 4 == 0 && reinterpret_cast<uintptr_t>(w_scales) % 4 == 0,
             "moe_grouped_matmul_fp8: 16-byte aligned operands and a workspace");
  grouped::run_fp8(out, in, in_scales, w, w_scales, offsets, n_experts, n_in, n_out, workspace, compute_sms(device),
                   device, stream);
}

template void moe_quantize_e4m3<__nv_bfloat16>(uint8_t*, float*, const __nv_bfloat16*, const int32_t*, int64_t,
                                               int64_t, int64_t, cudaStream_t);
template void moe_quantize_e4m3<__half>(uint8_t*, float*, const __half*, const int32_t*, int64_t, int64_t, int64_t,
                                        cudaStream_t);

}  // namespace lfm2::cuda
