// The short-conv mixer and the MoE router/experts on the CPU against direct double references:
// conv at the sequence start, router options and top-k tie-breaking, the weighted expert sum; the
// FP8 SwiGLU quantization's code rule (moe_grouped_fp8.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/error.h"
#include "common/fp8.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_grouped_fp8.h"
#include "kernels/moe_router.h"
#include "kernels/sample.h"
#include "kernels/short_conv.h"
#include "test_util.h"

namespace lfm2 {
namespace {

using test::randn;
using test::rel_err;

TEST(ShortConv, MatchesZeroPaddedConvolution) {
  for (auto [n_seq, S, H, L] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 5, 3}, {3, 2, 7, 3},
                                {2, 10, 16, 3}, {2, 9, 33, 4}, {4, 70, 8, 2}}) {
    const int64_t T = n_seq * S;
    auto bcx = randn(T * 3 * H, 20), w = randn(H * L, 21);
    std::vector<double> ref(size_t(T * H));
    for (int64_t s = 0; s < n_seq; ++s)
      for (int64_t t = 0; t < S; ++t)
        for (int64_t c = 0; c < H; ++c) {
          double z = 0;
          for (int64_t j = 0; j < L; ++j) {
            const int64_t tt = t - (L - 1) + j;  // zero padding before the sequence start
            if (tt < 0) continue;
            const float* row = bcx.data() + (s * S + tt) * 3 * H;
            z += double(w[c * L + j]) * double(row[c]) * double(row[2 * H + c]);
          }
          ref[(s * S + t) * H + c] = double(bcx[(s * S + t) * 3 * H + H + c]) * z;
        }
    std::vector<float> out1(ref.size()), out4(ref.size());
    cpu::short_conv(out1.data(), bcx.data(), w.data(), n_seq, S, H, L, 1);
    cpu::short_conv(out4.data(), bcx.data(), w.data(), n_seq, S, H, L, 4);
    EXPECT_LE(rel_err(out1, ref), 1e-6) << n_seq << "x" << S << " H " << H << " L " << L;
    EXPECT_EQ(out1, out4);
    // at t = 0 only the last tap sees data: out = C * w[L-1] * B * x (two fp32 roundings)
    for (int64_t c = 0; c < H; ++c) {
      const float* row = bcx.data();
      EXPECT_EQ(out1[c], row[H + c] * (w[c * L + L - 1] * (row[c] * row[2 * H + c])));
    }
  }
}

// Reference router: stable sort by score (ties: lower index first), weights in double.
void ref_router(const std::vector<float>& logits, const std::vector<float>* bias, int64_t T, int64_t E, int64_t k,
                bool norm, double scale, std::vector<int32_t>* idx, std::vector<double>* wts) {
  idx->assign(size_t(T * k), 0);
  wts->assign(size_t(T * k), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(static_cast<size_t>(E)), s(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      p[e] = 1.0 / (1.0 + std::exp(-double(logits[t * E + e])));
      s[e] = bias ? double(float(p[e]) + (*bias)[e]) : p[e];
    }
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      (*idx)[t * k + j] = order[j];
      (*wts)[t * k + j] = (norm ? p[order[j]] / (sum + 1e-6) : p[order[j]]) * scale;
    }
  }
}

TEST(MoeRouter, MatchesReferenceForEveryOption) {
  const int64_t T = 61, E = 9;
  auto logits = randn(T * E, 22, 2.0f), bias = randn(E, 23, 0.3f);
  for (int64_t k : {1, 2, 4, 9})
    for (bool norm : {false, true})
      for (bool use_bias : {false, true})
        for (float scale : {1.0f, 2.5f}) {
          std::vector<int32_t> idx1(size_t(T * k)), idx4(size_t(T * k)), ridx;
          std::vector<float> w1(size_t(T * k)), w4(size_t(T * k));
          std::vector<double> rw;
          const float* b = use_bias ? bias.data() : nullptr;
          cpu::moe_router(w1.data(), idx1.data(), logits.data(), b, T, E, k, norm, scale, 1);
          cpu::moe_router(w4.data(), idx4.data(), logits.data(), b, T, E, k, norm, scale, 4);
          ref_router(logits, use_bias ? &bias : nullptr, T, E, k, norm, scale, &ridx, &rw);
          EXPECT_EQ(idx1, ridx) << "k " << k << " norm " << norm << " bias " << use_bias;
          EXPECT_LE(rel_err(w1, rw), 1e-6);
          EXPECT_EQ(idx1, idx4);
          EXPECT_EQ(w1, w4);
        }
}

TEST(MoeRouter, BiasSelectsButDoesNotWeight) {
  // expert 2 has the lowest sigmoid but a large bias: it is picked, with its unbiased weight.
  std::vector<float> logits = {1.0f, 0.5f, -2.0f, 0.0f}, bias = {0, 0, 10.0f, 0};
  std::vector<int32_t> idx(2);
  std::vector<float> w(2);
  cpu::moe_router(w.data(), idx.data(), logits.data(), bias.data(), 1, 4, 2, false, 1.0f);
  EXPECT_EQ(idx, (std::vector<int32_t>{2, 0}));
  EXPECT_FLOAT_EQ(w[0], 1.0f / (1.0f + std::exp(2.0f)));
  EXPECT_FLOAT_EQ(w[1], 1.0f / (1.0f + std::exp(-1.0f)));
}

TEST(MoeRouter, TiesGoToTheLowerIndex) {
  // Row 0: all equal. Row 1: experts 1, 3, 5 tie for first. Row 2: saturated sigmoids (== 1.0f).
  const int64_t E = 6, k = 2;
  std::vector<float> logits = {0, 0, 0, 0, 0, 0,  //
                               -1, 2, 0, 2, -3, 2,  //
                               -50, 40, 30, 50, 0, 0};
  std::vector<int32_t> idx(3 * k);
  std::vector<float> w(3 * k);
  cpu::moe_router(w.data(), idx.data(), logits.data(), nullptr, 3, E, k, true, 1.0f);
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 1, 3, 1, 2}));
  EXPECT_FLOAT_EQ(w[0], 0.5f / (1.0f + 1e-6f));
}

TEST(MoeExperts, MatchesWeightedSumOfSwiGluMlps) {
  for (auto [T, H, E, Im, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 8, 4, 4, 1},
                                {50, 24, 6, 12, 2}, {37, 17, 5, 9, 5}}) {
    auto x = randn(T * H, 24), w1 = randn(E * Im * H, 25, 0.3f), w3 = randn(E * Im * H, 26, 0.3f),
         w2 = randn(E * H * Im, 27, 0.3f), logits = randn(T * E, 28);
    std::vector<int32_t> idx(size_t(T * k));
    std::vector<float> wts(size_t(T * k));
    cpu::moe_router(wts.data(), idx.data(), logits.data(), nullptr, T, E, k, true, 1.5f);

    std::vector<double> ref(size_t(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = idx[t * k + j];
        std::vector<double> h(static_cast<size_t>(Im));
        for (int64_t r = 0; r < Im; ++r) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < H; ++c) {
            g += double(x[t * H + c]) * w1[(e * Im + r) * H + c];
            u += double(x[t * H + c]) * w3[(e * Im + r) * H + c];
          }
          h[r] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int64_t c = 0; c < H; ++c) {
          double y = 0;
          for (int64_t r = 0; r < Im; ++r) y += h[r] * w2[(e * H + c) * Im + r];
          ref[t * H + c] += wts[t * k + j] * y;
        }
      }
    std::vector<float> out1(ref.size()), out4(ref.size());
    for (int threads : {1, 4}) {
      const auto need = cpu::moe_experts_scratch(T, H, E, Im, k, threads);
      std::vector<float> fs(size_t(need.floats));
      std::vector<int32_t> is(size_t(need.ints));
      cpu::moe_experts(threads == 1 ? out1.data() : out4.data(), x.data(), w1.data(), w3.data(), w2.data(),
                       idx.data(), wts.data(), T, H, E, Im, k, fs.data(), is.data(), threads);
    }
    EXPECT_LE(rel_err(out1, ref), 2e-6) << "T " << T << " E " << E << " k " << k;
    EXPECT_EQ(out1, out4);
  }
}

// Generation's finished rows: flagged from their fed-back token, their pairs dropped; the experts
// then give the other rows exactly what they give them alone, and the dropped rows nothing.
TEST(MoeExperts, DroppedRowsGetNothingAndChangeNothingElse) {
  const int64_t T = 23, H = 16, E = 6, Im = 8, k = 2;
  auto x = randn(T * H, 31), w1 = randn(E * Im * H, 32, 0.3f), w3 = randn(E * Im * H, 33, 0.3f),
       w2 = randn(E * H * Im, 34, 0.3f), logits = randn(T * E, 35);
  std::vector<int32_t> idx(static_cast<size_t>(T * k)), tokens(static_cast<size_t>(T));
  std::vector<float> wts(static_cast<size_t>(T * k)), done(static_cast<size_t>(T));
  cpu::moe_router(wts.data(), idx.data(), logits.data(), nullptr, T, E, k, true, 1.0f);
  for (int64_t t = 0; t < T; ++t) tokens[size_t(t)] = int32_t(t % 5 == 1 ? 7 : t % 7 == 3 ? 9 : 100 + t);
  cpu::finished_flags(done.data(), tokens.data(), T, {7, 9});
  int64_t n_done = 0;
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(done[size_t(t)], (t % 5 == 1 || t % 7 == 3) ? 1.0f : 0.0f) << "row " << t;
    n_done += done[size_t(t)] != 0;
  }
  ASSERT_GT(n_done, 3);
  ASSERT_LT(n_done, T);

  auto experts = [&](const std::vector<float>& in, const std::vector<int32_t>& ids, const std::vector<float>& w,
                     int64_t n) {
    const auto need = cpu::moe_experts_scratch(n, H, E, Im, k, 2);
    std::vector<float> fs(size_t(need.floats)), out(size_t(n * H));
    std::vector<int32_t> is(size_t(need.ints));
    cpu::moe_experts(out.data(), in.data(), w1.data(), w3.data(), w2.data(), ids.data(), w.data(), n, H, E, Im, k,
                     fs.data(), is.data(), 2);
    return out;
  };
  std::vector<int32_t> dropped = idx;
  cpu::moe_drop_rows(dropped.data(), done.data(), T, k);
  const auto got = experts(x, dropped, wts, T);
  // the live rows alone
  std::vector<float> live_x, live_w;
  std::vector<int32_t> live_ids;
  for (int64_t t = 0; t < T; ++t)
    if (done[size_t(t)] == 0) {
      live_x.insert(live_x.end(), x.begin() + t * H, x.begin() + (t + 1) * H);
      live_ids.insert(live_ids.end(), idx.begin() + t * k, idx.begin() + (t + 1) * k);
      live_w.insert(live_w.end(), wts.begin() + t * k, wts.begin() + (t + 1) * k);
    }
  const auto live = experts(live_x, live_ids, live_w, T - n_done);
  const auto all = experts(x, idx, wts, T);  // undropped, every row gets something
  for (int64_t t = 0; t < T; ++t)
    EXPECT_NE(std::vector<float>(all.begin() + t * H, all.begin() + (t + 1) * H), std::vector<float>(size_t(H), 0.0f));
  for (int64_t t = 0, l = 0; t < T; ++t) {
    const std::vector<float> row(got.begin() + t * H, got.begin() + (t + 1) * H);
    if (done[size_t(t)] != 0) {
      EXPECT_EQ(row, std::vector<float>(size_t(H), 0.0f)) << "dropped row " << t;
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(dropped[size_t(t * k + j)], -1);
    } else {
      EXPECT_EQ(row, std::vector<float>(live.begin() + l * H, live.begin() + (l + 1) * H)) << "live row " << t;
      ++l;
    }
  }
}

// The SwiGLU's e4m3 codes (the GPU's rule, moe_grouped_fp8.h): e4m3(v * (448 / amax)) per group;
// a group whose amax is below 2^-100 (the factor could overflow: NaN codes for its zeros) by v / s.
TEST(Fp8SwigluQuantize, CodesByTheGroupsFactorAndBySBelowTwoToTheMinus100) {
  const int64_t inter = 128, rows = 2;
  const std::vector<int32_t> offsets = {0, 2};
  auto gu = randn(rows * 2 * inter, 40);
  for (int64_t c = 0; c < 2 * inter; ++c) {  // row 1: a SwiGLU of subnormals, every fifth input 0
    float& v = gu[size_t(2 * inter + c)];
    v = c % 5 == 0 ? 0.f : v * 1e-20f;
  }
  std::vector<uint8_t> q(size_t(rows * inter));
  std::vector<float> s(static_cast<size_t>(rows));
  cpu::moe_swiglu_quantize_e4m3(q.data(), s.data(), gu.data(), nullptr, offsets.data(), rows, 1, inter, false);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu.data() + r * 2 * inter;
    std::vector<float> a(static_cast<size_t>(inter));
    float amax = 0;
    for (int64_t c = 0; c < inter; ++c) {
      a[size_t(c)] = g[c] / (1.0f + std::exp(-g[c])) * g[inter + c];
      amax = std::max(amax, std::fabs(a[size_t(c)]));
    }
    ASSERT_GT(amax, 0.f);
    EXPECT_EQ(r == 1, amax < 0x1p-100f);
    EXPECT_EQ(s[size_t(r)], amax / kE4m3Max);  // scales laid out (group, row): one group here
    for (int64_t c = 0; c < inter; ++c) {
      const float v = a[size_t(c)];
      const uint8_t want = float_to_e4m3(r == 0 ? v * (kE4m3Max / amax) : v / s[size_t(r)]);
      ASSERT_EQ(q[size_t(r * inter + c)], want) << "row " << r << " column " << c;
      ASSERT_FALSE(e4m3_is_nan(q[size_t(r * inter + c)]));
      if (v == 0.f) EXPECT_EQ(q[size_t(r * inter + c)] & 0x7f, 0);
    }
  }
}

// Padding rows (pad_src -1, moe_pad_rows'): zero codes and scales 1, their gate_up never read (NaN
// there); the other rows as without pad_src.
TEST(Fp8SwigluQuantize, PaddingRowsGetZeroCodesAndScalesOne) {
  const int64_t inter = 256, rows = 5, G = inter / 128;
  const std::vector<int32_t> offsets = {0, rows}, pad = {0, -1, 7, -1, 2};
  auto gu = randn(rows * 2 * inter, 41);
  std::vector<uint8_t> want_q(size_t(rows * inter));
  std::vector<float> want_s(size_t(rows * G));
  cpu::moe_swiglu_quantize_e4m3(want_q.data(), want_s.data(), gu.data(), nullptr, offsets.data(), rows, 1, inter,
                                false);
  for (const int64_t r : {1, 3})
    std::fill_n(gu.begin() + r * 2 * inter, 2 * inter, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint8_t> q(want_q.size(), 0x55);
  std::vector<float> s(want_s.size(), -1.f);
  cpu::moe_swiglu_quantize_e4m3(q.data(), s.data(), gu.data(), pad.data(), offsets.data(), rows, 1, inter, false);
  for (int64_t r = 0; r < rows; ++r) {
    const bool padding = pad[size_t(r)] < 0;
    for (int64_t c = 0; c < inter; ++c)
      ASSERT_EQ(q[size_t(r * inter + c)], padding ? 0 : want_q[size_t(r * inter + c)]) << "row " << r << " col " << c;
    for (int64_t g = 0; g < G; ++g)
      EXPECT_EQ(s[size_t(g * rows + r)], padding ? 1.f : want_s[size_t(g * rows + r)]) << "row " << r;
  }
}

// cpu::moe_pad_rows (the padded FP8 product's layout and the oracle of the GPU's moe_pad_rows) on a
// grouping written out by hand: 3 experts with 130, 0 and 2 rows, 5 tokens, a dropped pair.
TEST(MoePadRows, MovesEachExpertToATileBoundary) {
  const int64_t E = 3, P = 133, m_pad = 768;  // moe_padded_rows(133, 3) = 640, and 128 more
  const std::vector<int32_t> offsets = {0, 130, 130, 132};
  std::vector<int32_t> src_token(static_cast<size_t>(P)), dest_row(static_cast<size_t>(P));
  for (int64_t r = 0; r < 132; ++r) src_token[size_t(r)] = int32_t(r % 5);
  for (int64_t i = 0; i < P; ++i) dest_row[size_t(i)] = i == 7 ? -1 : int32_t(i < 7 ? i : i - 1);  // pair 7 dropped
  std::vector<int32_t> src_pad(static_cast<size_t>(m_pad)), dest_pad(static_cast<size_t>(P)),
      tiles(static_cast<size_t>(m_pad / 128)), one(2);
  int32_t used = 0;
  cpu::moe_pad_rows(src_pad.data(), dest_pad.data(), tiles.data(), one.data(), &used, offsets.data(),
                    src_token.data(), dest_row.data(), P, E, m_pad);
  EXPECT_EQ(used, 256 + 0 + 128);  // 130 rows -> two tiles, 0 -> none, 2 -> one
  EXPECT_EQ(one, (std::vector<int32_t>{0, int32_t(m_pad)}));
  EXPECT_EQ(tiles, (std::vector<int32_t>{0, 0, 2, 2, 2, 2}));  // the tiles past the rows in use: the last expert
  for (int64_t r = 0; r < m_pad; ++r) {
    int32_t want = -1;
    if (r < 130) want = int32_t(r % 5);                         // expert 0 from row 0
    if (r >= 256 && r < 258) want = int32_t((130 + r - 256) % 5);  // expert 2 from row 256
    ASSERT_EQ(src_pad[size_t(r)], want) << "padded row " << r;
  }
  for (int64_t i = 0; i < P; ++i) {
    const int32_t d = dest_row[size_t(i)];
    ASSERT_EQ(dest_pad[size_t(i)], d < 0 ? -1 : d < 130 ? d : d - 130 + 256) << "pair " << i;
  }
  EXPECT_THROW(cpu::moe_pad_rows(src_pad.data(), dest_pad.data(), tiles.data(), one.data(), &used, offsets.data(),
                                 src_token.data(), dest_row.data(), P, E, 256),
               Error);  // 384 padded rows needed
}

}  // namespace
}  // namespace lfm2
