// The paged-cache CPU twins: attention_paged gives cpu::attention's bits (decode rows and prompt
// chunks) for any page placement, page size and chunking; qk_norm_rope_store equals the CPU stage's
// rmsnorm + rope + copies, and refuses a position with no page before writing anything; its fp8
// variant stores each k and v head row as common/fp8.h's codec gives it (e4m3(x / s) * s).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/fp8.h"
#include "kernels/attention.h"
#include "kernels/attention_paged.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/rope_store.h"
#include "test_util.h"

namespace lfm2 {
namespace {

using test::randn;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Contiguous caches (n_seq, max_len, kv) copied into pools of pages placed by a shuffle (unused
// slots NaN, so a stray read shows), with the block table that finds them.
struct Paged {
  std::vector<float> k, v;
  std::vector<int32_t> table;
  int64_t max_pages;
};

Paged to_pages(const std::vector<float>& k, const std::vector<float>& v, int64_t n_seq, int64_t max_len, int64_t kv,
               int64_t page_size, uint32_t seed) {
  Paged p;
  p.max_pages = max_len / page_size;
  const int64_t n_pages = n_seq * p.max_pages + 3;
  std::vector<int32_t> perm(static_cast<size_t>(n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  p.k.assign(size_t(n_pages * page_size * kv), kNaN);
  p.v = p.k;
  p.table.assign(size_t(n_seq * p.max_pages), -1);
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t lp = 0; lp < p.max_pages; ++lp) {
      const int32_t page = perm[size_t(s * p.max_pages + lp)];
      p.table[size_t(s * p.max_pages + lp)] = page;
      const int64_t src = (s * max_len + lp * page_size) * kv, dst = int64_t(page) * page_size * kv;
      std::copy(k.begin() + src, k.begin() + src + page_size * kv, p.k.begin() + dst);
      std::copy(v.begin() + src, v.begin() + src + page_size * kv, p.v.begin() + dst);
    }
  return p;
}

// Decode rows: row s (one query at position pos[s] of sequence s) gets the bits cpu::attention gives
// the last row of a prompt of pos[s] + 1 rows over the same keys and values.
TEST(AttentionPaged, DecodeRowsGetAttentionsBits) {
  const int64_t n_seq = 4, max_len = 128, nh = 8, nkv = 2, hd = 16, kv = nkv * hd, width = nh * hd;
  const auto k = randn(n_seq * max_len * kv, 1), v = randn(n_seq * max_len * kv, 2), q = randn(n_seq * width, 3, 2.f);
  const std::vector<int64_t> pos = {0, 127, 31, 64};
  std::vector<float> ref(q.size()), scratch(size_t(cpu::attention_scratch_floats(max_len, 2)));
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t len = pos[size_t(s)] + 1;
    std::vector<float> prompt_q(size_t(len * width), 0.f), prompt_out(prompt_q.size());
    std::copy(q.begin() + s * width, q.begin() + (s + 1) * width, prompt_q.end() - width);
    cpu::attention(prompt_out.data(), prompt_q.data(), k.data() + s * max_len * kv, v.data() + s * max_len * kv, 1,
                   len, nh, nkv, hd, 0.25f, scratch.data(), 2);
    std::copy(prompt_out.end() - width, prompt_out.end(), ref.begin() + s * width);
  }
  std::vector<PagedSeq> seqs;
  for (int64_t s = 0; s < n_seq; ++s) seqs.push_back({int32_t(s), 1, int32_t(pos[size_t(s)]), int32_t(s)});
  for (int64_t ps : {16, 32, 128}) {
    for (uint32_t seed : {1u, 2u}) {
      const Paged p = to_pages(k, v, n_seq, max_len, kv, ps, seed);
      std::vector<float> out(q.size(), kNaN);
      cpu::attention_paged(out.data(), q.data(), p.k.data(), p.v.data(), seqs.data(), n_seq, p.table.data(),
                           p.max_pages, ps, nh, nkv, hd, 0.25f, scratch.data(), 2);
      EXPECT_EQ(out, ref) << "page size " << ps << ", placement " << seed;
    }
  }
}

// Whole prompts and the same prompts in chunks of 1, 7 and 64 rows give cpu::attention's bits.
TEST(AttentionPaged, ChunksGetAttentionsBits) {
  const int64_t n_seq = 2, S = 80, nh = 4, nkv = 4, hd = 32, kv = nkv * hd, width = nh * hd;
  const auto k = randn(n_seq * S * kv, 4), v = randn(n_seq * S * kv, 5), q = randn(n_seq * S * width, 6, 2.f);
  std::vector<float> ref(q.size()), scratch(size_t(cpu::attention_scratch_floats(S, 1)));
  cpu::attention(ref.data(), q.data(), k.data(), v.data(), n_seq, S, nh, nkv, hd, 0.2f, scratch.data(), 1);
  const Paged p = to_pages(k, v, n_seq, S, kv, 16, 7);
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(64), S}) {
    std::vector<float> out(q.size(), kNaN);
    for (int64_t first = 0; first < S; first += chunk) {
      const int32_t n = int32_t(std::min(chunk, S - first));
      // both sequences' chunks in one call, their rows where a whole prompt has them
      const std::vector<PagedSeq> seqs = {{int32_t(first), n, int32_t(first), 0},
                                          {int32_t(S + first), n, int32_t(first), 1}};
      cpu::attention_paged(out.data(), q.data(), p.k.data(), p.v.data(), seqs.data(), 2, p.table.data(), p.max_pages,
                           16, nh, nkv, hd, 0.2f, scratch.data(), 1);
    }
    EXPECT_EQ(out, ref) << "chunks of " << chunk;
  }
}

TEST(AttentionPaged, PositionsWithoutPagesAreRefused) {
  const int64_t nh = 2, nkv = 1, hd = 16;
  std::vector<float> pool(size_t(2 * 16 * hd), 0.f), q(size_t(nh * hd), 0.f), out(q.size(), 0.f), scratch(64);
  const std::vector<int32_t> table = {1, -1, 0, 0};  // [2 rows][2 pages]
  const PagedSeq past{0, 1, 32, 0}, unmapped{0, 1, 20, 0};
  EXPECT_THROW(cpu::attention_paged(out.data(), q.data(), pool.data(), pool.data(), &past, 1, table.data(), 2, 16, nh,
                                    nkv, hd, 1.f, scratch.data()),
               Error);
  EXPECT_THROW(cpu::attention_paged(out.data(), q.data(), pool.data(), pool.data(), &unmapped, 1, table.data(), 2, 16,
                                    nh, nkv, hd, 1.f, scratch.data()),
               Error);
  EXPECT_THROW(cpu::attention_paged(out.data(), q.data(), pool.data(), pool.data(), &unmapped, 1, table.data(), 2, 24,
                                    nh, nkv, hd, 1.f, scratch.data()),
               Error);  // not a power of two
}

TEST(RopeStore, EqualsTheStagesNormRopeAndCopies) {
  const int64_t nh = 4, nkv = 2, hd = 32, width = (nh + 2 * nkv) * hd, kv = nkv * hd, ps = 16, max_pages = 4;
  const float eps = 1e-5f;
  std::vector<float> inv(size_t(hd / 2));
  cpu::rope_inv_freq(inv.data(), hd, 1e6);
  const auto qn = randn(hd, 8), kn = randn(hd, 9);
  // a decode row at 37, a padding row, a prefill chunk of 3 rows at 14 (across a page boundary)
  const std::vector<PagedSeq> seqs = {{0, 1, 37, 1}, {2, 3, 14, 0}};
  const std::vector<int32_t> table = {3, 0, -1, -1, 5, 2, 4, -1};  // [2][4]
  const int64_t n_rows = 5, n_pages = 6;
  auto qkv = randn(n_rows * width, 10, 3.f);
  std::vector<float> want = qkv, kp(size_t(n_pages * ps * kv), kNaN), vp = kp, kp_want = kp, vp_want = kp;
  const std::vector<int64_t> row_pos = {37, -1, 14, 15, 16};
  const std::vector<int64_t> row_table = {1, -1, 0, 0, 0};
  for (int64_t r = 0; r < n_rows; ++r) {
    if (row_pos[size_t(r)] < 0) continue;
    float* x = want.data() + r * width;
    cpu::rmsnorm(x, x, qn.data(), nh, hd, eps);
    cpu::rmsnorm(x + nh * hd, x + nh * hd, kn.data(), nkv, hd, eps);
    cpu::rope(x, x, &row_pos[size_t(r)], inv.data(), 1, nh, hd);
    cpu::rope(x + nh * hd, x + nh * hd, &row_pos[size_t(r)], inv.data(), 1, nkv, hd);
    const int64_t p = row_pos[size_t(r)], page = table[size_t(row_table[size_t(r)] * max_pages + p / ps)];
    std::copy(x + nh * hd, x + nh * hd + kv, kp_want.begin() + (page * ps + p % ps) * kv);
    std::copy(x + nh * hd + kv, x + width, vp_want.begin() + (page * ps + p % ps) * kv);
  }
  cpu::qk_norm_rope_store(qkv.data(), kp.data(), vp.data(), qn.data(), kn.data(), inv.data(), seqs.data(), 2, n_rows,
                          table.data(), max_pages, ps, nh, nkv, hd, eps, 2);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
    return true;
  };
  EXPECT_EQ(qkv, want);
  EXPECT_TRUE(same(kp, kp_want));
  EXPECT_TRUE(same(vp, vp_want));

  // a chunk reaching an unmapped page is refused before anything is written
  const std::vector<PagedSeq> bad = {{0, 1, 40, 1}, {2, 3, 46, 1}};  // 46..48: page 3 of row 1 is -1
  auto qkv2 = qkv, kp2 = kp;
  EXPECT_THROW(cpu::qk_norm_rope_store(qkv2.data(), kp2.data(), vp.data(), qn.data(), kn.data(), inv.data(),
                                       bad.data(), 2, n_rows, table.data(), max_pages, ps, nh, nkv, hd, eps),
               Error);
  EXPECT_EQ(qkv2, qkv);
  EXPECT_TRUE(same(kp2, kp));
}

// The fp8 store: qkv as the plain store leaves it; each stored head row of k and v the codec's
// e4m3(x / s) * s of the plain store's row, s = amax / 448 (a zero row stays zero), within e4m3's
// rounding of it; nothing else written.
TEST(RopeStore, Fp8StoresEachHeadRowThroughTheCodec) {
  const int64_t nh = 4, nkv = 2, hd = 32, width = (nh + 2 * nkv) * hd, kv = nkv * hd, ps = 16, max_pages = 4;
  std::vector<float> inv(size_t(hd / 2));
  cpu::rope_inv_freq(inv.data(), hd, 1e6);
  const auto qn = randn(hd, 8), kn = randn(hd, 9);
  const std::vector<PagedSeq> seqs = {{0, 1, 37, 1}, {2, 3, 14, 0}};
  const std::vector<int32_t> table = {3, 0, -1, -1, 5, 2, 4, -1};
  const int64_t n_rows = 5, n_pages = 6;
  auto qkv = randn(n_rows * width, 10, 3.f);
  std::fill(qkv.begin() + 3 * width + nh * hd + kv, qkv.begin() + 3 * width + nh * hd + kv + hd, 0.f);  // a zero v row
  auto qkv8 = qkv;
  std::vector<float> kp(size_t(n_pages * ps * kv), kNaN), vp = kp, kp8 = kp, vp8 = kp;
  cpu::qk_norm_rope_store(qkv.data(), kp.data(), vp.data(), qn.data(), kn.data(), inv.data(), seqs.data(), 2, n_rows,
                          table.data(), max_pages, ps, nh, nkv, hd, 1e-5f, 2);
  cpu::qk_norm_rope_store_fp8(qkv8.data(), kp8.data(), vp8.data(), qn.data(), kn.data(), inv.data(), seqs.data(), 2,
                              n_rows, table.data(), max_pages, ps, nh, nkv, hd, 1e-5f, 2);
  EXPECT_EQ(qkv8, qkv);
  int64_t rows = 0;
  for (const auto* pools : {&kp, &vp}) {
    const std::vector<float>& plain = *pools;
    const std::vector<float>& q8 = pools == &kp ? kp8 : vp8;
    for (int64_t r = 0; r < n_pages * ps * nkv; ++r) {
      const float* x = plain.data() + r * hd;
      const float* y = q8.data() + r * hd;
      if (std::isnan(x[0])) {
        for (int64_t d = 0; d < hd; ++d) ASSERT_TRUE(std::isnan(y[d])) << "row " << r << " written";
        continue;
      }
      float amax = 0;
      for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
      const float s = amax > 0 ? amax / kE4m3Max : 1.f;
      for (int64_t d = 0; d < hd; ++d) {
        ASSERT_EQ(y[d], e4m3_to_float(float_to_e4m3(x[d] / s)) * s) << "row " << r << ", " << d;
        ASSERT_LE(std::fabs(y[d] - x[d]), std::fabs(x[d]) / 16 + s / 512) << "row " << r << ", " << d;
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 2 * 4 * nkv);  // 4 stored positions, k and v, every KV head
}

}  // namespace
}  // namespace lfm2
