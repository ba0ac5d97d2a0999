// The paged-cache kernels against their CPU twins, in fp32, bf16 and fp16, on seeded random data
// with shuffled physical pages (spare pages and slots past each length poisoned with NaN, block-table
// entries past each length -1): flash-decoding (cache lengths 1 .. 8705, GQA 1-8, head_dim 16/64/128),
// chunked prefill (several sequences' chunks in one launch), the fused norm + RoPE + store. Then the
// bit-invariance properties: a decode row alone or in a batch, on other pages or page sizes; a prompt
// prefilled in chunks of 1, 7, 64 or whole (= attention()'s bits). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/attention_paged.h"
#include "kernels/cuda/ops.h"
#include "kernels/rope.h"
#include "kernels/rope_store.h"

namespace lfm2 {
namespace {

using namespace test;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A host image of a paged cache holding sequences of the given lengths: the k, v of (sequence s,
// position p) come from per-sequence random streams, so every placement holds the same cache.
// place_seed 0: consecutive pages in order (a contiguous run per sequence); otherwise shuffled.
struct Cache {
  int64_t page_size, max_pages, n_pages, kv;
  std::vector<int32_t> table;  // [n_seqs][max_pages], -1 past each length
  std::vector<float> k, v;     // [n_pages][page_size][kv], NaN where nothing is stored
};

Cache make_cache(const std::vector<int64_t>& lens, int64_t max_len, int64_t page_size, int64_t kv,
                 uint64_t place_seed) {
  Cache c{page_size, (max_len + page_size - 1) / page_size, 3, kv, {}, {}, {}};
  for (int64_t len : lens) c.n_pages += (len + page_size - 1) / page_size;
  std::vector<int32_t> perm(static_cast<size_t>(c.n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  if (place_seed) std::shuffle(perm.begin(), perm.end(), std::mt19937(uint32_t(place_seed)));
  c.table.assign(lens.size() * size_t(c.max_pages), -1);
  c.k.assign(size_t(c.n_pages * page_size * kv), kNaN);
  c.v = c.k;
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const auto kr = rand_vec(size_t(lens[s] * kv), 1000 + s), vr = rand_vec(size_t(lens[s] * kv), 2000 + s);
    for (int64_t lp = 0; lp * page_size < lens[s]; ++lp) c.table[s * size_t(c.max_pages) + size_t(lp)] = perm[next++];
    for (int64_t p = 0; p < lens[s]; ++p) {
      const int64_t dst = (int64_t(c.table[s * size_t(c.max_pages) + size_t(p / page_size)]) * page_size +
                           p % page_size) * kv;
      std::copy(kr.begin() + p * kv, kr.begin() + (p + 1) * kv, c.k.begin() + dst);
      std::copy(vr.begin() + p * kv, vr.begin() + (p + 1) * kv, c.v.begin() + dst);
    }
  }
  return c;
}

// The cache on the device in T (the host image rounded to T, as the device sees it).
template <typename T>
struct DevCache {
  DevBuf<T> k, v;
  DevBuf<int32_t> table;
  explicit DevCache(Cache& c) : k(c.k.size()), v(c.v.size()), table(c.table.size()) {
    upload(k, round_to<T>(c.k));
    upload(v, round_to<T>(c.v));
    upload(table, c.table);
  }
};

template <typename T>
std::vector<float> run_decode(const std::vector<PagedSeq>& seqs, DevCache<T>& dc, const Cache& c, const DevBuf<T>& q,
                              int64_t n_rows, int64_t nh, int64_t nkv, int64_t hd, int64_t q_stride,
                              cudaStream_t stream) {
  DevBuf<PagedSeq> d_seqs(seqs.size());
  upload(d_seqs, seqs);
  const int64_t ws =
      cuda::attention_decode_paged_workspace_bytes(int64_t(seqs.size()), nh, hd, c.max_pages * c.page_size);
  DevBuf<unsigned char> work(static_cast<size_t>(ws));
  DevBuf<T> out(size_t(n_rows * nh * hd));
  cuda::attention_decode_paged(out.get(), q.get(), dc.k.get(), dc.v.get(), d_seqs.get(), int64_t(seqs.size()),
                               dc.table.get(), c.max_pages, c.page_size, nh, nkv, hd, 0.3f, work.get(), stream,
                               q_stride);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(out.get(), out.size());
}

std::vector<float> cpu_paged(const std::vector<PagedSeq>& seqs, const Cache& c, const std::vector<float>& q,
                             int64_t n_rows, int64_t nh, int64_t nkv, int64_t hd, int64_t q_stride) {
  std::vector<float> out(size_t(n_rows * nh * hd), kNaN);
  std::vector<float> scratch(size_t(cpu::attention_paged_scratch_floats(c.max_pages * c.page_size, 4)));
  cpu::attention_paged(out.data(), q.data(), c.k.data(), c.v.data(), seqs.data(), int64_t(seqs.size()),
                       c.table.data(), c.max_pages, c.page_size, nh, nkv, hd, 0.3f, scratch.data(), 4, q_stride);
  return out;
}

// Rows i of the output (n_heads * head_dim each).
std::vector<float> rows_of(const std::vector<float>& out, int64_t first, int64_t n, int64_t width) {
  return std::vector<float>(out.begin() + first * width, out.begin() + (first + n) * width);
}

template <typename T>
class CudaPaged : public CudaTest {};
TYPED_TEST_SUITE(CudaPaged, ElemTypes, ElemNames);

// 8705: past 16 splits of 512 positions, so splits of 9 tiles, the last one short
const std::vector<int64_t> kLens = {1, 2, 63, 64, 65, 511, 513, 1000, 4097, 8705};
constexpr int64_t kMaxLen = 8768;  // the caches' max_len (max_pages = its pages, rounded up)

// One decode row per sequence, the 10 lengths in one batch, rows in reverse order of the sequences
// and q rows of qkv width; against the CPU twin.
TYPED_TEST(CudaPaged, DecodeMatchesCpu) {
  using T = TypeParam;
  for (int64_t group : {1, 2, 4, 8})
    for (int64_t hd : {16, 64, 128}) {
      const int64_t nkv = 2, nh = nkv * group, stride = (nh + 2 * nkv) * hd, n = int64_t(kLens.size());
      Cache c = make_cache(kLens, kMaxLen, group == 4 ? 64 : 16, nkv * hd, 7 + uint64_t(group));
      DevCache<T> dc(c);
      auto q = rand_vec(size_t(n * stride), 50 + uint64_t(hd), 3.f);
      DevBuf<T> dq(q.size());
      upload(dq, round_to<T>(q));
      std::vector<PagedSeq> seqs;
      for (int64_t s = 0; s < n; ++s)
        seqs.push_back({int32_t(n - 1 - s), 1, int32_t(kLens[size_t(s)] - 1), int32_t(s)});
      const auto got = run_decode<T>(seqs, dc, c, dq, n, nh, nkv, hd, stride, this->stream_);
      EXPECT_TRUE(close_t<T>(got, cpu_paged(seqs, c, q, n, nh, nkv, hd, stride))) << "group " << group << ", hd " << hd;
    }
}

// A row's bits: alone or among others, on other pages, with other page sizes.
TYPED_TEST(CudaPaged, DecodeBitsIndependentOfBatchAndPages) {
  using T = TypeParam;
  const int64_t nkv = 8, nh = 32, hd = 64, n = int64_t(kLens.size()), width = nh * hd;
  auto q = rand_vec(size_t(n * width), 60, 3.f);
  DevBuf<T> dq(q.size());
  upload(dq, round_to<T>(q));
  std::vector<PagedSeq> seqs;
  for (int64_t s = 0; s < n; ++s) seqs.push_back({int32_t(s), 1, int32_t(kLens[size_t(s)] - 1), int32_t(s)});
  Cache c0 = make_cache(kLens, kMaxLen, 16, nkv * hd, 0);
  DevCache<T> d0(c0);
  const auto all = run_decode<T>(seqs, d0, c0, dq, n, nh, nkv, hd, 0, this->stream_);
  EXPECT_TRUE(close_t<T>(all, cpu_paged(seqs, c0, q, n, nh, nkv, hd, 0)));
  for (auto [ps, seed] : {std::pair<int64_t, uint64_t>{16, 3}, {64, 4}, {256, 5}}) {
    Cache c = make_cache(kLens, kMaxLen, ps, nkv * hd, seed);
    DevCache<T> dc(c);
    EXPECT_EQ(run_decode<T>(seqs, dc, c, dq, n, nh, nkv, hd, 0, this->stream_), all) << "page size " << ps;
    for (int64_t s : {0, 5, 8}) {  // alone, as row 0 of a batch of one
      const std::vector<PagedSeq> one = {{0, 1, seqs[size_t(s)].first_pos, int32_t(s)}};
      DevBuf<T> q1(static_cast<size_t>(width));
      std::vector<float> qs = rows_of(q, s, 1, width);
      upload(q1, round_to<T>(qs));
      EXPECT_EQ(run_decode<T>(one, dc, c, q1, 1, nh, nkv, hd, 0, this->stream_), rows_of(all, s, 1, width))
          << "sequence " << s << " alone, page size " << ps;
    }
  }
}

// Several sequences' chunks in one launch (one of 1 row, one across pages far into its cache),
// against the CPU twin.
TYPED_TEST(CudaPaged, PrefillMatchesCpu) {
  using T = TypeParam;
  const std::vector<std::pair<int32_t, int32_t>> chunks = {{0, 70}, {100, 37}, {5, 1}, {4000, 97}, {0, 3}};
  std::vector<int64_t> lens;
  std::vector<PagedSeq> seqs;
  int32_t row = 0, max_rows = 0;
  for (size_t s = 0; s < chunks.size(); ++s) {
    lens.push_back(chunks[s].first + chunks[s].second);
    seqs.push_back({row, chunks[s].second, chunks[s].first, int32_t(s)});
    row += chunks[s].second;
    max_rows = std::max(max_rows, chunks[s].second);
  }
  for (int64_t group : {1, 2, 4, 8})
    for (int64_t hd : {16, 64, 128}) {
      const int64_t nkv = 2, nh = nkv * group, stride = (nh + 2 * nkv) * hd;
      Cache c = make_cache(lens, 4160, 32, nkv * hd, 11 + uint64_t(hd));
      DevCache<T> dc(c);
      auto q = rand_vec(size_t(row * stride), 80 + uint64_t(group), 3.f);
      DevBuf<T> dq(q.size());
      upload(dq, round_to<T>(q));
      DevBuf<PagedSeq> d_seqs(seqs.size());
      upload(d_seqs, seqs);
      DevBuf<T> out(size_t(row * nh * hd));
      cuda::attention_prefill_paged(out.get(), dq.get(), dc.k.get(), dc.v.get(), d_seqs.get(), int64_t(seqs.size()),
                                    max_rows, dc.table.get(), c.max_pages, c.page_size, nh, nkv, hd, 0.3f,
                                    this->stream_, stride);
      this->sync();
      EXPECT_TRUE(close_t<T>(download(out.get(), out.size()), cpu_paged(seqs, c, q, row, nh, nkv, hd, stride)))
          << "group " << group << ", hd " << hd;
    }
}

// A prompt prefilled whole, or in chunks of 1, 7 and 64 rows (each chunk's launch holding another
// sequence's chunk too, the cache past the chunk still NaN), gives the same bits: attention()'s.
TYPED_TEST(CudaPaged, PrefillBitsIndependentOfChunking) {
  using T = TypeParam;
  const int64_t S = 300, nkv = 2, nh = 8, hd = 64, width = (nh + 2 * nkv) * hd, kv = nkv * hd;
  Cache full = make_cache({S, S}, S, 16, kv, 21);
  auto q = rand_vec(size_t(S * width), 90, 3.f);
  const auto q_raw = round_to<T>(q);
  DevBuf<T> dq(q.size());
  upload(dq, q_raw);

  // the reference: attention() over the prompt's own q/k/v rows
  std::vector<float> qkv = q;
  for (int64_t p = 0; p < S; ++p) {
    const int64_t src = (int64_t(full.table[size_t(p / 16)]) * 16 + p % 16) * kv;
    std::copy(full.k.begin() + src, full.k.begin() + src + kv, qkv.begin() + p * width + nh * hd);
    std::copy(full.v.begin() + src, full.v.begin() + src + kv, qkv.begin() + p * width + nh * hd + kv);
  }
  DevBuf<T> d_qkv(qkv.size()), ref(size_t(S * nh * hd));
  upload(d_qkv, round_to<T>(qkv));
  cuda::attention(ref.get(), d_qkv.get(), d_qkv.get() + nh * hd, d_qkv.get() + nh * hd + kv, 1, S, nh, nkv, hd, 0.3f,
                  this->stream_, width, width);
  this->sync();
  const auto want = download(ref.get(), ref.size());

  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(64), S}) {
    DevBuf<T> out(size_t(S * nh * hd));
    for (int64_t first = 0; first < S; first += chunk) {
      const int32_t n = int32_t(std::min(chunk, S - first));
      Cache c = full;  // sequence 0's cache holds positions < first + n only
      for (int64_t p = first + n; p < S; ++p) {
        const int64_t dst = (int64_t(c.table[size_t(p / 16)]) * 16 + p % 16) * kv;
        std::fill(c.k.begin() + dst, c.k.begin() + dst + kv, kNaN);
        std::fill(c.v.begin() + dst, c.v.begin() + dst + kv, kNaN);
      }
      DevCache<T> dc(c);
      // sequence 1 (another prompt) has a chunk in the same launch, its rows after ours
      const int32_t other = int32_t(std::min<int64_t>(S - 1, 3 * first % S));
      const std::vector<PagedSeq> seqs = {{int32_t(first), n, int32_t(first), 0}, {int32_t(S), 1, other, 1}};
      DevBuf<PagedSeq> d_seqs(seqs.size());
      upload(d_seqs, seqs);
      DevBuf<T> q2(size_t((S + 1) * width));
      CUDA_CHECK(cudaMemcpy(q2.get(), dq.get(), size_t(S * width) * sizeof(T), cudaMemcpyDeviceToDevice));
      DevBuf<T> out2(size_t((S + 1) * nh * hd));
      CUDA_CHECK(cudaMemcpy(out2.get(), out.get(), size_t(S * nh * hd) * sizeof(T), cudaMemcpyDeviceToDevice));
      cuda::attention_prefill_paged(out2.get(), q2.get(), dc.k.get(), dc.v.get(), d_seqs.get(), 2, n, dc.table.get(),
                                    c.max_pages, 16, nh, nkv, hd, 0.3f, this->stream_, width);
      this->sync();
      CUDA_CHECK(cudaMemcpy(out.get(), out2.get(), size_t(S * nh * hd) * sizeof(T), cudaMemcpyDeviceToDevice));
    }
    EXPECT_EQ(download(out.get(), out.size()), want) << "chunks of " << chunk;
  }
}

// The fused store: q and k as qk_norm_rope gives them (bits), k and v in their pages (bits), and
// against the CPU twin; decode rows and a prefill chunk in one launch, a padding row left alone.
TYPED_TEST(CudaPaged, NormRopeStore) {
  using T = TypeParam;
  for (auto [nh, nkv, hd, ps] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{32, 8, 64, 16},
                                 {4, 2, 128, 64}, {6, 3, 16, 32}}) {
    const int64_t width = (nh + 2 * nkv) * hd, kv = nkv * hd, max_pages = 8, n_pages = 20;
    // decode rows at 37 and 0, a padding row, a chunk of 40 rows at 100 (across pages)
    const std::vector<PagedSeq> seqs = {{0, 1, 37, 2}, {1, 1, 0, 0}, {3, 40, int32_t(ps == 16 ? 60 : 100), 1}};
    const int64_t n_rows = 43;
    std::vector<int32_t> table(size_t(3 * max_pages), -1);
    std::vector<int32_t> perm(static_cast<size_t>(n_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(uint32_t(hd)));
    for (size_t i = 0; i < table.size() && i < perm.size(); ++i) table[i] = perm[i];
    std::vector<float> inv(size_t(hd / 2));
    cpu::rope_inv_freq(inv.data(), hd, 1e6);
    auto qn = rand_vec(size_t(hd), 100, 1.5f), kn = rand_vec(size_t(hd), 101, 1.5f);
    auto qkv = rand_vec(size_t(n_rows * width), 102, 3.f);
    const auto raw = round_to<T>(qkv);
    DevBuf<T> d_qkv(raw.size()), d_ref(raw.size()), kp(size_t(n_pages * ps * kv)), vp(kp.size());
    DevBuf<float> d_qn(qn.size()), d_kn(kn.size()), d_inv(inv.size());
    DevBuf<int32_t> d_table(table.size());
    DevBuf<PagedSeq> d_seqs(seqs.size());
    upload(d_qkv, raw);
    upload(d_ref, raw);
    upload(d_qn, qn);
    upload(d_kn, kn);
    upload(d_inv, inv);
    upload(d_table, table);
    upload(d_seqs, seqs);
    cuda::qk_norm_rope_store(d_qkv.get(), kp.get(), vp.get(), d_qn.get(), d_kn.get(), d_inv.get(), d_seqs.get(), 3,
                             n_rows, d_table.get(), max_pages, ps, nh, nkv, hd, 1e-5f, this->stream_);
    this->sync();
    const auto got = download(d_qkv.get(), raw.size()), got_k = download(kp.get(), kp.size()),
               got_v = download(vp.get(), vp.size());
    // CPU twin
    std::vector<float> want = qkv, k_want(kp.size(), kNaN), v_want(kp.size(), kNaN);
    cpu::qk_norm_rope_store(want.data(), k_want.data(), v_want.data(), qn.data(), kn.data(), inv.data(), seqs.data(), 3,
                            n_rows, table.data(), max_pages, ps, nh, nkv, hd, 1e-5f, 2);
    EXPECT_TRUE(close_t<T>(got, want, 2)) << nh << "/" << nkv << "/" << hd;
    // qk_norm_rope at the same positions (each sequence's rows as the last rows of a prompt of
    // first_pos + n_rows rows), and the pages holding those rows' k and v
    for (const PagedSeq& s : seqs) {
      const int64_t len = int64_t(s.first_pos) + s.n_rows;
      DevBuf<T> prompt(size_t(len * width));
      CUDA_CHECK(cudaMemcpy(prompt.get() + s.first_pos * width, d_ref.get() + s.row * width,
                            size_t(s.n_rows * width) * sizeof(T), cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaDeviceSynchronize());  // the copy ran on the legacy stream
      cuda::qk_norm_rope(prompt.get(), d_qn.get(), d_kn.get(), d_inv.get(), 1, len, nh, nkv, hd, 1e-5f,
                         this->stream_);
      this->sync();
      const auto normed = download(prompt.get() + s.first_pos * width, size_t(s.n_rows * width));
      for (int32_t i = 0; i < s.n_rows; ++i) {
        const int64_t r = s.row + i, pos = s.first_pos + i;
        const std::vector<float> row_want(normed.begin() + i * width, normed.begin() + (i + 1) * width);
        ASSERT_EQ(std::vector<float>(got.begin() + r * width, got.begin() + (r + 1) * width), row_want) << "row " << r;
        const int64_t dst = (int64_t(table[size_t(s.table_row * max_pages + pos / ps)]) * ps + pos % ps) * kv;
        ASSERT_EQ(std::vector<float>(got_k.begin() + dst, got_k.begin() + dst + kv),
                  std::vector<float>(row_want.begin() + nh * hd, row_want.begin() + nh * hd + kv)) << "k of row " << r;
        ASSERT_EQ(std::vector<float>(got_v.begin() + dst, got_v.begin() + dst + kv),
                  std::vector<float>(row_want.begin() + nh * hd + kv, row_want.end())) << "v of row " << r;
      }
    }
    EXPECT_EQ(std::vector<float>(got.begin() + 2 * width, got.begin() + 3 * width),
              std::vector<float>(qkv.begin() + 2 * width, qkv.begin() + 3 * width)) << "the padding row";
  }
}

}  // namespace
}  // namespace lfm2
