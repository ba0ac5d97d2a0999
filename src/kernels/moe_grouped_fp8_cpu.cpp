// CPU twins of the FP8 grouped GEMM (moe_grouped_fp8.h).
#include "kernels/moe_grouped_fp8.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/fp8.h"

namespace lfm2::cpu {
namespace {

// Row r's values (cols of them, in v) quantized into q with its scale(s) placed as documented:
// codes e4m3(v / s), or, by_factor (the SwiGLU's), e4m3(v * (448 / amax)) where amax >= 2^-100.
void quantize_row(uint8_t* q, float* scales, const float* v, int64_t r, int64_t r0, int64_t m, int64_t cols,
                  bool per_row, bool by_factor = false) {
  const int64_t G = cols / kFp8Block, group = per_row ? cols : kFp8Block;
  for (int64_t c0 = 0; c0 < cols; c0 += group) {
    float amax = 0;
    for (int64_t c = c0; c < c0 + group; ++c) amax = std::max(amax, std::fabs(v[c]));
    const float s = amax > 0 ? amax / kE4m3Max : 1.0f;
    const float f = by_factor && amax >= 0x1p-100f ? kE4m3Max / amax : 0.f;
    for (int64_t c = c0; c < c0 + group; ++c) q[r * cols + c] = float_to_e4m3(f > 0 ? v[c] * f : v[c] / s);
    for (int64_t g = c0 / kFp8Block; g < (c0 + group) / kFp8Block; ++g) scales[r0 * G + g * m + (r - r0)] = s;
  }
}

// Calls f(r, r0, m) for every row of every expert.
template <class F>
void for_each_row(const int32_t* offsets, int64_t n_rows, int64_t n_experts, F&& f) {
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t r0 = offsets[e], m = offsets[e + 1] - r0;
    for (int64_t r = r0; r < r0 + m && r < n_rows; ++r) f(r, r0, m);
  }
}

}  // namespace

void moe_quantize_e4m3(uint8_t* q, float* scales, const float* x, const int32_t* src_row, const int32_t* offsets,
                       int64_t n_rows, int64_t n_experts, int64_t cols, bool per_row) {
  LFM2_CHECK(cols > 0 && cols % kFp8Block == 0, "moe_quantize_e4m3: ", cols, " columns (a multiple of 128)");
  const std::vector<float> zeros(static_cast<size_t>(cols), 0.f);
  for_each_row(offsets, n_rows, n_experts, [&](int64_t r, int64_t r0, int64_t m) {
    const int64_t src = src_row ? src_row[r] : r;
    quantize_row(q, scales, src < 0 ? zeros.data() : x + src * cols, r, r0, m, cols, per_row);
  });
}

void moe_pad_rows(int32_t* src_pad, int32_t* dest_pad, int32_t* tile_expert, int32_t* one_group, int32_t* used_rows,
                  const int32_t* offsets, const int32_t* src_token, const int32_t* dest_row, int64_t n_pairs,
                  int64_t n_experts, int64_t m_pad) {
  std::vector<int64_t> poff(static_cast<size_t>(n_experts + 1), 0);
  for (int64_t e = 0; e < n_experts; ++e)
    poff[size_t(e + 1)] = poff[size_t(e)] + (offsets[e + 1] - offsets[e] + 127) / 128 * 128;
  LFM2_CHECK(poff.back() <= m_pad && m_pad % 128 == 0, "moe_pad_rows: ", poff.back(), " padded rows in ", m_pad);
  std::fill_n(src_pad, m_pad, -1);
  std::fill_n(tile_expert, m_pad / 128, int32_t(n_experts - 1));
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) src_pad[r - offsets[e] + poff[size_t(e)]] = src_token[r];
    std::fill(tile_expert + poff[size_t(e)] / 128, tile_expert + poff[size_t(e + 1)] / 128, int32_t(e));
  }
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t d = dest_row[i];
    if (d < 0) {
      dest_pad[i] = -1;
      continue;
    }
    // the last e with offsets[e] <= d
    const int64_t e = std::upper_bound(offsets, offsets + n_experts, d) - offsets - 1;
    dest_pad[i] = int32_t(d - offsets[e] + poff[size_t(e)]);
  }
  one_group[0] = 0;
  one_group[1] = int32_t(m_pad);
  *used_rows = int32_t(poff.back());
}

void moe_swiglu_quantize_e4m3(uint8_t* q, float* scales, const float* gate_up, const int32_t* pad_src,
                              const int32_t* offsets, int64_t n_rows, int64_t n_experts, int64_t inter, bool per_row) {
  LFM2_CHECK(inter > 0 && inter % kFp8Block == 0, "moe_swiglu_quantize_e4m3: ", inter, " columns (a multiple of 128)");
  std::vector<float> a(static_cast<size_t>(inter));
  for_each_row(offsets, n_rows, n_experts, [&](int64_t r, int64_t r0, int64_t m) {
    const float* g = gate_up + r * 2 * inter;
    const bool pad = pad_src && pad_src[r] < 0;
    for (int64_t c = 0; c < inter; ++c) a[size_t(c)] = pad ? 0.f : g[c] / (1.0f + std::exp(-g[c])) * g[inter + c];
    quantize_row(q, scales, a.data(), r, r0, m, inter, per_row, true);
  });
}

void moe_grouped_matmul_fp8(float* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, Fp8Scheme w_scheme, const int32_t* offsets, int64_t n_experts,
                            int64_t n_in, int64_t n_out) {
  LFM2_CHECK(n_in % kFp8Block == 0 && n_out % kFp8Block == 0, "moe_grouped_matmul_fp8: ", n_in, " -> ", n_out,
             " (multiples of 128)");
  const int64_t KB = n_in / kFp8Block, NB = n_out / kFp8Block;
  const bool channel = w_scheme == Fp8Scheme::Channel;
  std::vector<float> a(static_cast<size_t>(n_in)), wf(static_cast<size_t>(n_out * n_in));
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t r0 = offsets[e], m = offsets[e + 1] - r0;
    if (m == 0) continue;
    const float* se = w_scales + e * KB * (channel ? n_out : NB);
    for (int64_t i = 0; i < n_out * n_in; ++i) wf[size_t(i)] = e4m3_to_float(w[e * n_out * n_in + i]);
    for (int64_t r = r0; r < r0 + m; ++r) {
      for (int64_t k = 0; k < n_in; ++k) a[size_t(k)] = e4m3_to_float(in[r * n_in + k]);
      for (int64_t n = 0; n < n_out; ++n) {
        const float* wn = wf.data() + n * n_in;
        float acc = 0;
        for (int64_t kb = 0; kb < KB; ++kb) {
          float part = 0;
          for (int64_t k = kb * kFp8Block; k < (kb + 1) * kFp8Block; ++k) part += a[size_t(k)] * wn[k];
          const float sa = in_scales[r0 * KB + kb * m + (r - r0)];
          // the GPU's order: (sum x scale_a) x scale_w per channel, sum x (scale_a x scale_w) per block
          acc += channel ? part * sa * se[kb * n_out + n] : part * (sa * se[kb * NB + n / kFp8Block]);
        }
        out[r * n_out + n] = acc;
      }
    }
  }
}

void moe_grouped_matmul_fp8_raw(float* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets,
                                int64_t n_experts, int64_t n_in, int64_t n_out) {
  std::vector<float> a(static_cast<size_t>(n_in)), wf(static_cast<size_t>(n_out * n_in));
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t r0 = offsets[e], m = offsets[e + 1] - r0;
    if (m == 0) continue;
    for (int64_t i = 0; i < n_out * n_in; ++i) wf[size_t(i)] = e4m3_to_float(w[e * n_out * n_in + i]);
    for (int64_t r = r0; r < r0 + m; ++r) {
      for (int64_t k = 0; k < n_in; ++k) a[size_t(k)] = e4m3_to_float(in[r * n_in + k]);
      for (int64_t n = 0; n < n_out; ++n) {
        const float* wn = wf.data() + n * n_in;
        float acc = 0;
        for (int64_t k = 0; k < n_in; ++k) acc += a[size_t(k)] * wn[k];
        out[r * n_out + n] = acc;
      }
    }
  }
}

void moe_swiglu_quantize_e4m3_scaled(uint8_t* q, float* scales, const float* gate_up, const float* in_scales,
                                     const float* w13_scales, const int32_t* offsets, int64_t n_rows,
                                     int64_t n_experts, int64_t n_in, int64_t inter) {
  LFM2_CHECK(inter > 0 && inter % kFp8Block == 0 && n_in % kFp8Block == 0, "moe_swiglu_quantize_e4m3_scaled: ", n_in,
             " -> ", inter, " (multiples of 128)");
  const int64_t G = n_in / kFp8Block;
  std::vector<float> a(static_cast<size_t>(inter));
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t r0 = offsets[e], m = offsets[e + 1] - r0;
    const float* sw = w13_scales + e * G * 2 * inter;
    for (int64_t r = r0; r < r0 + m && r < n_rows; ++r) {
      const float* g = gate_up + r * 2 * inter;
      const float sa = in_scales[r0 * G + (r - r0)];
      for (int64_t c = 0; c < inter; ++c) {
        const float gf = g[c] * sa * sw[c], uf = g[inter + c] * sa * sw[inter + c];
        a[size_t(c)] = gf / (1.0f + std::exp(-gf)) * uf;
      }
      quantize_row(q, scales, a.data(), r, r0, m, inter, true, true);
    }
  }
}

void moe_combine_fp8_scaled(float* x, const float* expert_out, const int32_t* dest_row, const float* weights,
                            const float* act_scales, const float* w2_scales, const int32_t* offsets,
                            int64_t n_tokens, int64_t n_experts, int64_t top_k, int64_t hidden, int64_t inter) {
  const int64_t G = inter / kFp8Block;
  std::vector<std::pair<int32_t, float>> pairs(static_cast<size_t>(top_k));
  std::vector<float> acc(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) pairs[size_t(k)] = {dest_row[t * top_k + k], weights[t * top_k + k]};
    std::stable_sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::fill(acc.begin(), acc.end(), 0.f);
    for (const auto& [p, wt] : pairs) {
      if (p < 0) continue;
      const int64_t e = std::upper_bound(offsets + 1, offsets + n_experts, p) - (offsets + 1), r0 = offsets[e];
      const float sa = act_scales[r0 * G + (p - r0)];
      const float* sw = w2_scales + e * G * hidden;
      for (int64_t c = 0; c < hidden; ++c) acc[size_t(c)] += expert_out[p * hidden + c] * sa * sw[c] * wt;
    }
    for (int64_t c = 0; c < hidden; ++c) x[t * hidden + c] += acc[size_t(c)];
  }
}

}  // namespace lfm2::cpu
