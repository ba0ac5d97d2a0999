#include "kernels/fp8_dequantize.h"

namespace lfm2::cpu {

void fp8_dequantize_mats(float* out, const uint8_t* q, const float* scale, Fp8Scheme scheme, int64_t n_mats,
                         int64_t rows, int64_t cols) {
  const int64_t per_scale = fp8_scale_rows(scheme, rows) * fp8_scale_cols(scheme, cols);
  for (int64_t m = 0; m < n_mats; ++m)
    fp8_dequantize(out + m * rows * cols, q + m * rows * cols, scale + m * per_scale, rows, cols, scheme);
}

}  // namespace lfm2::cpu
