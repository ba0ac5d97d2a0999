// FP8 products on the CPU: dequantize, then kernels/linear.h and kernels/moe_experts.h.
#include "kernels/fp8_products.h"

#include <vector>

#include "kernels/linear.h"
#include "kernels/moe_experts.h"

namespace lfm2::cpu {
namespace {

// Expert e's rows [r0, r0 + rows) of a stacked e4m3 tensor whose every expert is `total` rows of
// `cols`, its scales laid out as the halves [0, r1) and [r1, total) each with its own blocks.
void dequant_rows(float* out, const uint8_t* w, const float* s, Fp8Scheme scheme, int64_t e, int64_t total,
                  int64_t r1, int64_t r0, int64_t rows, int64_t cols) {
  const bool blocks = scheme == Fp8Scheme::Block128;
  const int64_t kb = fp8_scale_cols(scheme, cols);
  const int64_t half1 = fp8_scale_rows(scheme, r1), rb = half1 + fp8_scale_rows(scheme, total - r1);
  for (int64_t r = r0; r < r0 + rows; ++r) {
    const int64_t b = r < r1 ? (blocks ? r / kFp8Block : r) : half1 + (blocks ? (r - r1) / kFp8Block : r - r1);
    const float* sr = s + (e * rb + b) * kb;
    const uint8_t* q = w + (e * total + r) * cols;
    for (int64_t c = 0; c < cols; ++c) out[(r - r0) * cols + c] = e4m3_to_float(q[c]) * sr[blocks ? c / kFp8Block : 0];
  }
}

}  // namespace

void linear_fp8(float* out, const float* in, const uint8_t* w, const float* s, Fp8Scheme scheme, int64_t n_rows,
                int64_t n_in, int64_t n_out, int n_threads) {
  std::vector<float> wf(size_t(n_out * n_in));
  fp8_dequantize(wf.data(), w, s, n_out, n_in, scheme);
  linear(out, in, wf.data(), n_rows, n_in, n_out, n_threads);
}

void linear_fp8_act(float* out, const float* in, const uint8_t* w, const float* s, Fp8Scheme scheme, int64_t n_rows,
                    int64_t n_in, int64_t n_out, int n_threads) {
  std::vector<float> a(in, in + n_rows * n_in);
  fp8_fake_quantize_rows(a.data(), n_rows, n_in, scheme == Fp8Scheme::Block128 ? kFp8Block : n_in);
  linear_fp8(out, a.data(), w, s, scheme, n_rows, n_in, n_out, n_threads);
}

void moe_experts_fp8(float* out, const float* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                     const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights, int64_t n_tokens,
                     int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, int n_threads,
                     bool quantize_activations) {
  const int64_t H = hidden, I = inter, E = n_experts;
  std::vector<float> f1(size_t(E * I * H)), f3(f1.size()), f2(size_t(E * H * I));
  for (int64_t e = 0; e < E; ++e) {
    dequant_rows(f1.data() + e * I * H, w13, s13, scheme, e, 2 * I, I, 0, I, H);
    dequant_rows(f3.data() + e * I * H, w13, s13, scheme, e, 2 * I, I, I, I, H);
    dequant_rows(f2.data() + e * H * I, w2, s2, scheme, e, H, H, 0, H, I);
  }
  const MoeScratchSize need = moe_experts_scratch(n_tokens, H, E, I, top_k, n_threads);
  std::vector<float> scratch(size_t(need.floats));
  std::vector<int32_t> ints(size_t(need.ints));
  const int64_t act_group = !quantize_activations ? 0 : scheme == Fp8Scheme::Block128 ? kFp8Block : kFp8PerRow;
  moe_experts(out, in, f1.data(), f3.data(), f2.data(), experts, weights, n_tokens, H, E, I, top_k, scratch.data(),
              ints.data(), n_threads, act_group);
}

}  // namespace lfm2::cpu
