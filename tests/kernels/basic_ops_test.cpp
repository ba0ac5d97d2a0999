// CPU kernels on random data against direct double-precision formulas: embedding, rmsnorm,
// linear, swiglu, add, argmax. Each also runs with 1 and 4 threads and must give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "kernels/add.h"
#include "kernels/argmax.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
#include "test_util.h"

namespace lfm2 {
namespace {

using test::randn;
using test::rel_err;

TEST(Embedding, CopiesRowsAndRejectsBadIds) {
  const int64_t V = 11, H = 7;
  auto table = randn(V * H, 1);
  std::vector<int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(ids.size() * H);
  cpu::embedding(out.data(), ids.data(), table.data(), int64_t(ids.size()), V, H, 4);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < H; ++i) EXPECT_EQ(out[t * H + i], table[ids[t] * H + i]);
  ids[2] = int32_t(V);
  EXPECT_THROW(cpu::embedding(out.data(), ids.data(), table.data(), 4, V, H), Error);
  ids[2] = -1;
  EXPECT_THROW(cpu::embedding(out.data(), ids.data(), table.data(), 4, V, H), Error);
}

TEST(RmsNorm, MatchesDoubleFormula) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {33, 64}, {130, 257}}) {
    auto x = randn(rows * dim, 2, 3.0f), w = randn(dim, 3);
    const float eps = 1e-5f;
    std::vector<double> ref(size_t(rows * dim));
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = w[i] * x[r * dim + i] * inv;
    }
    std::vector<float> out1(ref.size()), out4(ref.size());
    cpu::rmsnorm(out1.data(), x.data(), w.data(), rows, dim, eps, 1);
    cpu::rmsnorm(out4.data(), x.data(), w.data(), rows, dim, eps, 4);
    EXPECT_LE(rel_err(out1, ref), 1e-6) << rows << "x" << dim;
    EXPECT_EQ(out1, out4);
    cpu::rmsnorm(x.data(), x.data(), w.data(), rows, dim, eps, 2);  // in place
    EXPECT_EQ(x, out1);
  }
}

TEST(Linear, MatchesDoubleProduct) {
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 17, 3}, {37, 129, 100}, {64, 256, 33}}) {
    auto x = randn(M * K, 4), w = randn(N * K, 5);
    std::vector<float> out1(size_t(M * N)), out4(size_t(M * N));
    cpu::linear(out1.data(), x.data(), w.data(), M, K, N, 1);
    cpu::linear(out4.data(), x.data(), w.data(), M, K, N, 4);
    EXPECT_EQ(out1, out4);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          ref += double(x[i * K + k]) * w[j * K + k];
          mag += std::fabs(double(x[i * K + k]) * w[j * K + k]);
        }
        // fp32 summation bound for 8 interleaved lanes of K/8 terms, with slack.
        const double tol = 2 * 6e-8 * (double(K) / 8 + 4) * mag;
        ASSERT_NEAR(out1[i * N + j], ref, tol) << M << "x" << K << "x" << N << " at " << i << "," << j;
      }
  }
}

TEST(SwiGlu, MatchesDoubleFormula) {
  const int64_t n = 100003;
  auto g = randn(n, 6, 4.0f), u = randn(n, 7);
  std::vector<float> out1(static_cast<size_t>(n)), out4(static_cast<size_t>(n));
  cpu::swiglu(out1.data(), g.data(), u.data(), n, 1);
  cpu::swiglu(out4.data(), g.data(), u.data(), n, 4);
  EXPECT_EQ(out1, out4);
  for (int64_t i = 0; i < n; ++i) {
    const double ref = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
    ASSERT_NEAR(out1[i], ref, 4e-7 * std::fabs(ref) + 1e-30) << i;
  }
}

TEST(Add, Elementwise) {
  const int64_t n = 70001;
  auto a = randn(n, 8), b = randn(n, 9);
  std::vector<float> out(static_cast<size_t>(n));
  cpu::add(out.data(), a.data(), b.data(), n, 4);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
}

TEST(Argmax, FirstMaximumWinsAndNanNeverWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {1, 3, 3, 2,     // tie: first
                          nan, 0, -1, 0,  // NaN first: skipped, then first of the tied zeros
                          -5, -4, -4, -9,
                          7, 7, 7, 7};
  std::vector<int32_t> out(4);
  cpu::argmax(out.data(), x.data(), 4, 4, 2);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 1, 1, 0}));

  const int64_t rows = 50, cols = 1001;
  auto r = randn(rows * cols, 10);
  std::vector<int32_t> got1(rows), got4(rows);
  cpu::argmax(got1.data(), r.data(), rows, cols, 1);
  cpu::argmax(got4.data(), r.data(), rows, cols, 4);
  EXPECT_EQ(got1, got4);
  for (int64_t i = 0; i < rows; ++i) {
    int64_t best = 0;
    for (int64_t j = 1; j < cols; ++j)
      if (r[i * cols + j] > r[i * cols + best]) best = j;
    EXPECT_EQ(got1[i], best);
  }
}

TEST(Argmax, MarginIsTheGapToTheRunnerUp) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1, 3, 3, 2,      // tie: margin 0
                          nan, 0, -1, -3,  // NaN skipped: 0 - (-1)
                          -5, -4, -4.5, -9,
                          nan, nan, nan, nan};
  std::vector<int32_t> top(4);
  std::vector<float> margin(4);
  cpu::argmax_margin(top.data(), margin.data(), x.data(), 4, 4, 2);
  EXPECT_EQ(top, (std::vector<int32_t>{1, 1, 1, 0}));
  EXPECT_EQ(margin[0], 0.0f);
  EXPECT_EQ(margin[1], 1.0f);
  EXPECT_EQ(margin[2], 0.5f);
  EXPECT_TRUE(std::isnan(margin[3]));
  const float one[1] = {2.5f};
  cpu::argmax_margin(top.data(), margin.data(), one, 1, 1);
  EXPECT_EQ(top[0], 0);
  EXPECT_EQ(margin[0], inf);

  const int64_t rows = 40, cols = 777;
  auto r = randn(rows * cols, 11);
  std::vector<int32_t> t1(rows), t4(rows);
  std::vector<float> m1(rows), m4(rows);
  cpu::argmax_margin(t1.data(), m1.data(), r.data(), rows, cols, 1);
  cpu::argmax_margin(t4.data(), m4.data(), r.data(), rows, cols, 4);
  EXPECT_EQ(t1, t4);
  EXPECT_EQ(m1, m4);
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> row(r.begin() + i * cols, r.begin() + (i + 1) * cols);
    std::sort(row.rbegin(), row.rend());
    EXPECT_EQ(m1[i], row[0] - row[1]);
    EXPECT_EQ(r[i * cols + t1[i]], row[0]);
  }
}

}  // namespace
}  // namespace lfm2
