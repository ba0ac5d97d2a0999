// CPU twins of the FP8 grouped GEMM (moe_grouped_fp8.h).
#include "kernels/moe_grouped_fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "common/fp8.h"

namespace lfm2::cpu {

void moe_quantize_e4m3(uint8_t* q, float* scales, const float* x, const int32_t* offsets, int64_t n_rows,
                       int64_t n_experts, int64_t cols) {
  LFM2_CHECK(cols > 0 && cols % kFp8Block == 0, "moe_quantize_e4m3: ", cols, " columns (a multiple of 128)");
  const int64_t G = cols / kFp8Block;
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t r0 = offsets[e], m = offsets[e + 1] - r0;
    for (int64_t r = r0; r < r0 + m && r < n_rows; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const float* xg = x + r * cols + g * kFp8Block;
        float amax = 0;
        for (int64_t c = 0; c < kFp8Block; ++c) amax = std::max(amax, std::fabs(xg[c]));
        const float s = amax > 0 ? amax / kE4m3Max : 1.0f;
        for (int64_t c = 0; c < kFp8Block; ++c) q[r * cols + g * kFp8Block + c] = float_to_e4m3(xg[c] / s);
        scales[r0 * G + g * m + (r - r0)] = s;
      }
  }
}

void moe_grouped_matmul_fp8(float* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, const int32_t* offsets, int64_t n_experts, int64_t n_in,
                            int64_t n_out) {
  LFM2_CHECK(n_in % kFp8Block == 0 && n_out % kFp8Block == 0, "moe_grouped_matmul_fp8: ", n_in, " -> ", n_out,
             " (multiples of 128)");
  const int64_t KB = n_in / kFp8Block, NB = n_out / kFp8Block;
  std::vector<float> a(static_cast<size_t>(n_in)), wf(static_cast<size_t>(n_out * n_in));
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t r0 = offsets[e], m = offsets[e + 1] - r0;
    if (m == 0) continue;
    const float* se = w_scales + e * KB * NB;
    for (int64_t i = 0; i < n_out * n_in; ++i) wf[size_t(i)] = e4m3_to_float(w[e * n_out * n_in + i]);
    for (int64_t r = r0; r < r0 + m; ++r) {
      for (int64_t k = 0; k < n_in; ++k) a[size_t(k)] = e4m3_to_float(in[r * n_in + k]);
      for (int64_t n = 0; n < n_out; ++n) {
        const float* wn = wf.data() + n * n_in;
        float acc = 0;
        for (int64_t kb = 0; kb < KB; ++kb) {
          float part = 0;
          for (int64_t k = kb * kFp8Block; k < (kb + 1) * kFp8Block; ++k) part += a[size_t(k)] * wn[k];
          acc += part * (in_scales[r0 * KB + kb * m + (r - r0)] * se[kb * NB + n / kFp8Block]);
        }
        out[r * n_out + n] = acc;
      }
    }
  }
}

}  // namespace lfm2::cpu
