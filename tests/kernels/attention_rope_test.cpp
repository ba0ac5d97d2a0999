// RoPE and causal GQA attention on the CPU against double-precision references: RoPE at large
// positions, attention against a naive full-softmax version with an explicit causal mask.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/attention.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace lfm2 {
namespace {

using test::randn;
using test::rel_err;

TEST(Rope, InvFreqIsHfFp32Formula) {
  for (int64_t hd : {4, 64, 128}) {
    for (double theta : {1e4, 1e6, 5e5}) {
      std::vector<float> f(size_t(hd / 2));
      cpu::rope_inv_freq(f.data(), hd, theta);
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double ref = 1.0 / std::pow(theta, double(2 * i) / double(hd));
        EXPECT_NEAR(f[i], ref, 3e-7 * ref) << hd << " " << theta << " " << i;  // within ~2 ulp
      }
      EXPECT_EQ(f[0], 1.0f);
    }
  }
}

TEST(Rope, MatchesDoubleAtLargePositions) {
  const int64_t hd = 64, nh = 3;
  const std::vector<int64_t> pos = {0, 1, 7, 4095, 100000, 127999, 1000003, 123456789};
  const int64_t T = int64_t(pos.size());
  std::vector<float> inv(size_t(hd / 2));
  cpu::rope_inv_freq(inv.data(), hd, 1e6);
  auto x = randn(T * nh * hd, 11);
  std::vector<float> out1(x.size()), out4(x.size());
  cpu::rope(out1.data(), x.data(), pos.data(), inv.data(), T, nh, hd, 1);
  cpu::rope(out4.data(), x.data(), pos.data(), inv.data(), T, nh, hd, 4);
  EXPECT_EQ(out1, out4);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double a = double(pos[t]) * double(inv[i]);  // exact angle of the fp32 frequency
        const int64_t base = (t * nh + h) * hd;
        const double x1 = x[base + i], x2 = x[base + i + hd / 2];
        const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
        const double tol = 4e-7 * (std::fabs(x1) + std::fabs(x2));
        ASSERT_NEAR(out1[base + i], r1, tol) << "pos " << pos[t] << " i " << i;
        ASSERT_NEAR(out1[base + i + hd / 2], r2, tol) << "pos " << pos[t] << " i " << i;
      }
  // position 0 is the identity
  for (int64_t i = 0; i < nh * hd; ++i) EXPECT_EQ(out1[i], x[i]);
  // in place gives the same
  cpu::rope(x.data(), x.data(), pos.data(), inv.data(), T, nh, hd, 2);
  EXPECT_EQ(x, out1);
}

// Naive reference: full (S, S) score matrix per head in double, causal mask, softmax.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t n_seq, int64_t S, int64_t nh, int64_t nkv,
                                    int64_t hd, double scale) {
  std::vector<double> out(size_t(n_seq * S * nh * hd), 0.0);
  const int64_t group = nh / nkv;
  std::vector<double> sc(size_t(S * S));
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c)
            d += double(q[((s * S + i) * nh + h) * hd + c]) * k[((s * S + j) * nkv + g) * hd + c];
          sc[i * S + j] = j <= i ? d * scale : -std::numeric_limits<double>::infinity();
        }
      for (int64_t i = 0; i < S; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j < S; ++j) mx = std::fmax(mx, sc[i * S + j]);
        for (int64_t j = 0; j < S; ++j) sum += std::exp(sc[i * S + j] - mx);
        for (int64_t j = 0; j < S; ++j) {
          const double p = std::exp(sc[i * S + j] - mx) / sum;
          for (int64_t c = 0; c < hd; ++c)
            out[((s * S + i) * nh + h) * hd + c] += p * v[((s * S + j) * nkv + g) * hd + c];
        }
      }
    }
  return out;
}

struct AttnShape {
  int64_t n_seq, S, nh, nkv, hd;
};

TEST(Attention, MatchesNaiveFullSoftmax) {
  for (const AttnShape& sh : {AttnShape{2, 1, 4, 4, 8}, AttnShape{3, 37, 4, 2, 16}, AttnShape{1, 70, 8, 2, 64},
                              AttnShape{2, 19, 6, 1, 5}, AttnShape{1, 130, 2, 2, 12}}) {
    const int64_t T = sh.n_seq * sh.S;
    auto q = randn(T * sh.nh * sh.hd, 12, 2.0f), k = randn(T * sh.nkv * sh.hd, 13, 2.0f),
         v = randn(T * sh.nkv * sh.hd, 14);
    const float scale = float(std::pow(double(sh.hd), -0.5));
    const auto ref = naive_attention(q, k, v, sh.n_seq, sh.S, sh.nh, sh.nkv, sh.hd, scale);
    std::vector<float> out1(ref.size()), out4(ref.size());
    std::vector<float> scratch1(size_t(cpu::attention_scratch_floats(sh.S, 1)));
    std::vector<float> scratch4(size_t(cpu::attention_scratch_floats(sh.S, 4)));
    cpu::attention(out1.data(), q.data(), k.data(), v.data(), sh.n_seq, sh.S, sh.nh, sh.nkv, sh.hd, scale,
                   scratch1.data(), 1);
    cpu::attention(out4.data(), q.data(), k.data(), v.data(), sh.n_seq, sh.S, sh.nh, sh.nkv, sh.hd, scale,
                   scratch4.data(), 4);
    EXPECT_LE(rel_err(out1, ref), 2e-6) << "S " << sh.S << " heads " << sh.nh << "/" << sh.nkv << " hd " << sh.hd;
    EXPECT_EQ(out1, out4);
  }
}

TEST(Attention, ScratchIsLinearInSeqLenAndSequencesAreIndependent) {
  EXPECT_EQ(cpu::attention_scratch_floats(4096, 3), 3 * 4096);
  const int64_t n_seq = 2, S = 9, nh = 2, nkv = 1, hd = 4, T = n_seq * S;
  auto q = randn(T * nh * hd, 15), k = randn(T * nkv * hd, 16), v = randn(T * nkv * hd, 17);
  std::vector<float> scratch(size_t(cpu::attention_scratch_floats(S, 1)));
  std::vector<float> a(q.size()), b(q.size());
  cpu::attention(a.data(), q.data(), k.data(), v.data(), n_seq, S, nh, nkv, hd, 0.5f, scratch.data(), 1);
  for (int64_t i = 0; i < S * nkv * hd; ++i) k[i] += 1.0f, v[i] -= 2.0f;  // change sequence 0 only
  cpu::attention(b.data(), q.data(), k.data(), v.data(), n_seq, S, nh, nkv, hd, 0.5f, scratch.data(), 1);
  for (int64_t i = S * nh * hd; i < T * nh * hd; ++i) ASSERT_EQ(a[i], b[i]) << "sequence 1 changed at " << i;
  // the first token of a sequence attends only to itself: out = v
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t c = 0; c < hd; ++c) EXPECT_EQ(b[h * hd + c], v[c]);
}

}  // namespace
}  // namespace lfm2
