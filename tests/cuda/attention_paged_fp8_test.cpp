// The fp8 KV cache's kernels (--kv-dtype fp8, kernels/paged_kv.h) against their CPU twins, bf16 and
// fp16, seeded random data on shuffled pages (unused bytes e4m3 NaN, unused scales NaN): the store's
// e4m3 bytes and scales bit for bit against common/fp8.h's codec applied to the T rows the store
// leaves in qkv (and its qkv bits those of the T store); flash-decoding (cache lengths 1 .. 8705,
// GQA 1-16, head_dim 16/32/64/128, pages of 16 and 64) and chunked prefill against cpu::attention_paged
// over the dequantized cache, and bit for bit against the T kernels on that cache rounded to T (the
// fp8 kernels widen each tile to exactly those values, then run the same arithmetic); a decode row's
// bits alone or in a batch, on other pages or page sizes; a prompt's bits for any chunking. Skips
// without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "kernels/attention_paged.h"
#include "kernels/cuda/ops.h"
#include "kernels/rope.h"
#include "kernels/rope_store.h"

namespace lfm2 {
namespace {

using namespace test;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// An fp8 cache holding sequences of the given lengths (k, v of (sequence, position) from
// per-sequence streams): e4m3 bytes and scales, and the dequantized fp32 image the CPU reads.
struct Cache8 {
  int64_t page_size, max_pages, n_pages, nkv, hd;
  std::vector<int32_t> table;      // [n_seqs][max_pages], -1 past each length
  std::vector<float> k, v;         // dequantized [n_pages][page_size][nkv][hd], NaN where nothing is stored
  std::vector<uint8_t> k8, v8;     // e4m3, 0x7f (NaN) where nothing is stored
  std::vector<float> ks, vs;       // scales [n_pages][page_size][nkv], NaN where nothing is stored
};

// The codec of paged_kv.h on one row of n values: q bytes, the scale, x replaced by q * s.
float quantize_row(uint8_t* q, float* x, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax > 0 ? amax / kE4m3Max : 1.f;
  for (int64_t i = 0; i < n; ++i) {
    q[i] = float_to_e4m3(x[i] / s);
    x[i] = e4m3_to_float(q[i]) * s;
  }
  return s;
}

Cache8 make_cache8(const std::vector<int64_t>& lens, int64_t max_len, int64_t page_size, int64_t nkv, int64_t hd,
                   uint64_t place_seed, float amp = 1.f) {
  const int64_t kv = nkv * hd;
  Cache8 c{page_size, (max_len + page_size - 1) / page_size, 3, nkv, hd, {}, {}, {}, {}, {}, {}, {}};
  for (int64_t len : lens) c.n_pages += (len + page_size - 1) / page_size;
  std::vector<int32_t> perm(static_cast<size_t>(c.n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  if (place_seed) std::shuffle(perm.begin(), perm.end(), std::mt19937(uint32_t(place_seed)));
  c.table.assign(lens.size() * size_t(c.max_pages), -1);
  c.k.assign(size_t(c.n_pages * page_size * kv), kNaN);
  c.v = c.k;
  c.k8.assign(c.k.size(), 0x7f);
  c.v8 = c.k8;
  c.ks.assign(size_t(c.n_pages * page_size * nkv), kNaN);
  c.vs = c.ks;
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    auto kr = rand_vec(size_t(lens[s] * kv), 1000 + s, amp), vr = rand_vec(size_t(lens[s] * kv), 2000 + s, amp);
    for (int64_t lp = 0; lp * page_size < lens[s]; ++lp) c.table[s * size_t(c.max_pages) + size_t(lp)] = perm[next++];
    for (int64_t p = 0; p < lens[s]; ++p) {
      const int64_t row = int64_t(c.table[s * size_t(c.max_pages) + size_t(p / page_size)]) * page_size + p % page_size;
      for (int64_t h = 0; h < nkv; ++h) {
        const int64_t src = p * kv + h * hd, dst = row * kv + h * hd;
        c.ks[size_t(row * nkv + h)] = quantize_row(c.k8.data() + dst, kr.data() + src, hd);
        c.vs[size_t(row * nkv + h)] = quantize_row(c.v8.data() + dst, vr.data() + src, hd);
        std::copy(kr.begin() + src, kr.begin() + src + hd, c.k.begin() + dst);
        std::copy(vr.begin() + src, vr.begin() + src + hd, c.v.begin() + dst);
      }
    }
  }
  return c;
}

struct DevCache8 {
  DevBuf<uint8_t> k8, v8;
  DevBuf<float> ks, vs;
  DevBuf<int32_t> table;
  explicit DevCache8(const Cache8& c)
      : k8(c.k8.size()), v8(c.v8.size()), ks(c.ks.size()), vs(c.vs.size()), table(c.table.size()) {
    upload(k8, c.k8);
    upload(v8, c.v8);
    upload(ks, c.ks);
    upload(vs, c.vs);
    upload(table, c.table);
  }
};

template <typename T>
std::vector<float> run_decode8(const std::vector<PagedSeq>& seqs, const DevCache8& dc, const Cache8& c,
                               const DevBuf<T>& q, int64_t n_rows, int64_t nh, int64_t q_stride, cudaStream_t stream) {
  DevBuf<PagedSeq> d_seqs(seqs.size());
  upload(d_seqs, seqs);
  const int64_t ws =
      cuda::attention_decode_paged_workspace_bytes(int64_t(seqs.size()), nh, c.hd, c.max_pages * c.page_size);
  DevBuf<unsigned char> work(static_cast<size_t>(ws));
  DevBuf<T> out(size_t(n_rows * nh * c.hd));
  cuda::attention_decode_paged_fp8(out.get(), q.get(), dc.k8.get(), dc.v8.get(), dc.ks.get(), dc.vs.get(),
                                   d_seqs.get(), int64_t(seqs.size()), dc.table.get(), c.max_pages, c.page_size, nh,
                                   c.nkv, c.hd, 0.3f, work.get(), stream, q_stride);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(out.get(), out.size());
}

template <typename T>
std::vector<float> run_prefill8(const std::vector<PagedSeq>& seqs, int64_t max_rows, const DevCache8& dc,
                                const Cache8& c, const DevBuf<T>& q, int64_t n_rows, int64_t nh, int64_t q_stride,
                                cudaStream_t stream) {
  DevBuf<PagedSeq> d_seqs(seqs.size());
  upload(d_seqs, seqs);
  DevBuf<T> out(size_t(n_rows * nh * c.hd));
  cuda::attention_prefill_paged_fp8(out.get(), q.get(), dc.k8.get(), dc.v8.get(), dc.ks.get(), dc.vs.get(),
                                    d_seqs.get(), int64_t(seqs.size()), max_rows, dc.table.get(), c.max_pages,
                                    c.page_size, nh, c.nkv, c.hd, 0.3f, stream, q_stride);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(out.get(), out.size());
}

// The T kernels on the dequantized cache rounded to T: what the fp8 kernels must give bit for bit.
template <typename T>
struct TCache {
  DevBuf<T> k, v;
  explicit TCache(const Cache8& c) : k(c.k.size()), v(c.v.size()) {
    std::vector<float> kk = c.k, vv = c.v;
    upload(k, round_to<T>(kk));
    upload(v, round_to<T>(vv));
  }
};

template <typename T>
std::vector<float> run_decode_t(const std::vector<PagedSeq>& seqs, const DevCache8& dc, const Cache8& c,
                                const DevBuf<T>& q, int64_t n_rows, int64_t nh, int64_t q_stride, cudaStream_t stream) {
  TCache<T> tc(c);
  DevBuf<PagedSeq> d_seqs(seqs.size());
  upload(d_seqs, seqs);
  const int64_t ws =
      cuda::attention_decode_paged_workspace_bytes(int64_t(seqs.size()), nh, c.hd, c.max_pages * c.page_size);
  DevBuf<unsigned char> work(static_cast<size_t>(ws));
  DevBuf<T> out(size_t(n_rows * nh * c.hd));
  cuda::attention_decode_paged(out.get(), q.get(), tc.k.get(), tc.v.get(), d_seqs.get(), int64_t(seqs.size()),
                               dc.table.get(), c.max_pages, c.page_size, nh, c.nkv, c.hd, 0.3f, work.get(), stream,
                               q_stride);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(out.get(), out.size());
}

template <typename T>
std::vector<float> run_prefill_t(const std::vector<PagedSeq>& seqs, int64_t max_rows, const DevCache8& dc,
                                 const Cache8& c, const DevBuf<T>& q, int64_t n_rows, int64_t nh, int64_t q_stride,
                                 cudaStream_t stream) {
  TCache<T> tc(c);
  DevBuf<PagedSeq> d_seqs(seqs.size());
  upload(d_seqs, seqs);
  DevBuf<T> out(size_t(n_rows * nh * c.hd));
  cuda::attention_prefill_paged(out.get(), q.get(), tc.k.get(), tc.v.get(), d_seqs.get(), int64_t(seqs.size()),
                                max_rows, dc.table.get(), c.max_pages, c.page_size, nh, c.nkv, c.hd, 0.3f, stream,
                                q_stride);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(out.get(), out.size());
}

std::vector<float> cpu_paged(const std::vector<PagedSeq>& seqs, const Cache8& c, const std::vector<float>& q,
                             int64_t n_rows, int64_t nh, int64_t q_stride) {
  std::vector<float> out(size_t(n_rows * nh * c.hd), kNaN);
  std::vector<float> scratch(size_t(cpu::attention_paged_scratch_floats(c.max_pages * c.page_size, 4)));
  cpu::attention_paged(out.data(), q.data(), c.k.data(), c.v.data(), seqs.data(), int64_t(seqs.size()),
                       c.table.data(), c.max_pages, c.page_size, nh, c.nkv, c.hd, 0.3f, scratch.data(), 4, q_stride);
  return out;
}

template <typename T>
class CudaPagedFp8 : public CudaTest {};
using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaPagedFp8, HalfTypes, ElemNames);

// 8705: past 16 splits of 512 positions, so splits of 9 tiles, the last one short
const std::vector<int64_t> kLens = {1, 2, 63, 64, 65, 511, 513, 1000, 4097, 8705};
constexpr int64_t kMaxLen = 8768;  // the caches' max_len (max_pages = its pages, rounded up)
// T's absolute tolerance x 1.5 against the fp32 oracle: the T kernels' inputs are the dequantized
// values rounded to T (their bits are checked exactly), and on these draws one bf16 output (group 8,
// head_dim 128, decode and prefill alike) lands 0.0105 off where T's tolerance allows 0.0104 (H100).
constexpr double kCpuSlack = 1.5;

TYPED_TEST(CudaPagedFp8, DecodeMatchesCpu) {
  using T = TypeParam;
  for (int64_t ps : {16, 64})
    for (int64_t group : {1, 2, 4, 8, 16})
      for (int64_t hd : {16, 32, 64, 128}) {
        const int64_t nkv = 2, nh = nkv * group, stride = (nh + 2 * nkv) * hd, n = int64_t(kLens.size());
        const Cache8 c = make_cache8(kLens, kMaxLen, ps, nkv, hd, 7 + uint64_t(group));
        DevCache8 dc(c);
        auto q = rand_vec(size_t(n * stride), 50 + uint64_t(hd), 3.f);
        DevBuf<T> dq(q.size());
        upload(dq, round_to<T>(q));
        std::vector<PagedSeq> seqs;
        for (int64_t s = 0; s < n; ++s)
          seqs.push_back({int32_t(n - 1 - s), 1, int32_t(kLens[size_t(s)] - 1), int32_t(s)});
        const auto got = run_decode8<T>(seqs, dc, c, dq, n, nh, stride, this->stream_);
        EXPECT_TRUE(close_t<T>(got, cpu_paged(seqs, c, q, n, nh, stride), kCpuSlack))
            << "pages of " << ps << ", group " << group << ", hd " << hd;
        EXPECT_EQ(got, run_decode_t<T>(seqs, dc, c, dq, n, nh, stride, this->stream_))
            << "the T kernel's bits, pages of " << ps << ", group " << group << ", hd " << hd;
      }
}

TYPED_TEST(CudaPagedFp8, DecodeBitsIndependentOfBatchAndPages) {
  using T = TypeParam;
  const int64_t nkv = 8, nh = 32, hd = 64, n = int64_t(kLens.size()), width = nh * hd;
  auto q = rand_vec(size_t(n * width), 60, 3.f);
  DevBuf<T> dq(q.size());
  upload(dq, round_to<T>(q));
  std::vector<PagedSeq> seqs;
  for (int64_t s = 0; s < n; ++s) seqs.push_back({int32_t(s), 1, int32_t(kLens[size_t(s)] - 1), int32_t(s)});
  const Cache8 c0 = make_cache8(kLens, kMaxLen, 16, nkv, hd, 0);
  DevCache8 d0(c0);
  const auto all = run_decode8<T>(seqs, d0, c0, dq, n, nh, 0, this->stream_);
  EXPECT_TRUE(close_t<T>(all, cpu_paged(seqs, c0, q, n, nh, 0)));
  for (auto [ps, seed] : {std::pair<int64_t, uint64_t>{16, 3}, {64, 4}, {256, 5}}) {
    const Cache8 c = make_cache8(kLens, kMaxLen, ps, nkv, hd, seed);
    DevCache8 dc(c);
    EXPECT_EQ(run_decode8<T>(seqs, dc, c, dq, n, nh, 0, this->stream_), all) << "page size " << ps;
    for (int64_t s : {0, 5, 8}) {
      const std::vector<PagedSeq> one = {{0, 1, seqs[size_t(s)].first_pos, int32_t(s)}};
      DevBuf<T> q1(static_cast<size_t>(width));
      std::vector<float> qs(q.begin() + s * width, q.begin() + (s + 1) * width);
      upload(q1, round_to<T>(qs));
      EXPECT_EQ(run_decode8<T>(one, dc, c, q1, 1, nh, 0, this->stream_),
                std::vector<float>(all.begin() + s * width, all.begin() + (s + 1) * width))
          << "sequence " << s << " alone, page size " << ps;
    }
  }
}

TYPED_TEST(CudaPagedFp8, PrefillMatchesCpu) {
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
  for (int64_t ps : {16, 64})
    for (int64_t group : {1, 2, 4, 8})
      for (int64_t hd : {16, 64, 128}) {
        const int64_t nkv = 2, nh = nkv * group, stride = (nh + 2 * nkv) * hd;
        const Cache8 c = make_cache8(lens, 4160, ps, nkv, hd, 11 + uint64_t(hd));
        DevCache8 dc(c);
        auto q = rand_vec(size_t(row * stride), 80 + uint64_t(group), 3.f);
        DevBuf<T> dq(q.size());
        upload(dq, round_to<T>(q));
        const auto got = run_prefill8<T>(seqs, max_rows, dc, c, dq, row, nh, stride, this->stream_);
        EXPECT_TRUE(close_t<T>(got, cpu_paged(seqs, c, q, row, nh, stride), kCpuSlack))
            << "pages of " << ps << ", group " << group << ", hd " << hd;
        EXPECT_EQ(got, run_prefill_t<T>(seqs, max_rows, dc, c, dq, row, nh, stride, this->stream_))
            << "the T kernel's bits, pages of " << ps << ", group " << group << ", hd " << hd;
      }
}

// A prompt of 300 rows prefilled whole or in chunks of 1, 7 and 64 (each launch also holding another
// sequence's row) gives the same bits.
TYPED_TEST(CudaPagedFp8, PrefillBitsIndependentOfChunking) {
  using T = TypeParam;
  const int64_t S = 300, nkv = 2, nh = 8, hd = 64, width = (nh + 2 * nkv) * hd;
  const Cache8 c = make_cache8({S, S}, S, 16, nkv, hd, 21);
  DevCache8 dc(c);
  auto q = rand_vec(size_t((S + 1) * width), 90, 3.f);
  DevBuf<T> dq(q.size());
  upload(dq, round_to<T>(q));
  std::vector<float> whole;
  for (int64_t chunk : {S, int64_t(1), int64_t(7), int64_t(64)}) {
    std::vector<float> got(size_t(S * nh * hd), kNaN);
    for (int64_t first = 0; first < S; first += chunk) {
      const int32_t n = int32_t(std::min(chunk, S - first));
      const int32_t other = int32_t(std::min<int64_t>(S - 1, 3 * first % S));
      const std::vector<PagedSeq> seqs = {{int32_t(first), n, int32_t(first), 0}, {int32_t(S), 1, other, 1}};
      const auto out = run_prefill8<T>(seqs, n, dc, c, dq, S + 1, nh, width, this->stream_);
      std::copy(out.begin() + first * nh * hd, out.begin() + (first + n) * nh * hd, got.begin() + first * nh * hd);
    }
    if (chunk == S) {
      whole = got;
      std::vector<PagedSeq> one = {{0, int32_t(S), 0, 0}};
      EXPECT_TRUE(close_t<T>(got, cpu_paged(one, c, std::vector<float>(q.begin(), q.begin() + S * width), S, nh,
                                            width)));
    } else {
      EXPECT_EQ(got, whole) << "chunks of " << chunk;
    }
  }
}

struct StoreCounts {
  int64_t rows = 0, subnormal = 0;
};

// Every stored (row, head) of seqs: its e4m3 bytes and scale are the codec of the T values the store
// left in qkv (`got`; bits), its dequantized values near the CPU twin's (k_want, v_want); returns which
// scales were written.
template <typename T>
std::vector<bool> check_stored(const std::vector<uint8_t>& gk, const std::vector<uint8_t>& gv,
                               const std::vector<float>& gks, const std::vector<float>& gvs,
                               const std::vector<float>& got, const std::vector<float>& k_want,
                               const std::vector<float>& v_want, const std::vector<PagedSeq>& seqs,
                               const std::vector<int32_t>& table, int64_t max_pages, int64_t ps, int64_t nh,
                               int64_t nkv, int64_t hd, StoreCounts& n) {
  const int64_t width = (nh + 2 * nkv) * hd, kv = nkv * hd;
  std::vector<bool> written(gks.size(), false);
  for (const PagedSeq& s : seqs)
    for (int32_t i = 0; i < s.n_rows; ++i) {
      const int64_t r = s.row + i, pos = s.first_pos + i;
      const int64_t prow = int64_t(table[size_t(s.table_row * max_pages + pos / ps)]) * ps + pos % ps;
      for (int64_t h = 0; h < 2 * nkv; ++h) {  // k heads, then v heads
        const bool is_v = h >= nkv;
        const int64_t kh = h % nkv, dst = prow * kv + kh * hd;
        std::vector<float> x(got.begin() + r * width + nh * hd + h * hd, got.begin() + r * width + nh * hd + (h + 1) * hd);
        std::vector<uint8_t> q(static_cast<size_t>(hd));
        const float sc = quantize_row(q.data(), x.data(), hd);
        const auto& gb = is_v ? gv : gk;
        EXPECT_TRUE(std::equal(q.begin(), q.end(), gb.begin() + dst)) << "row " << r << " head " << h;
        EXPECT_EQ((is_v ? gvs : gks)[size_t(prow * nkv + kh)], sc) << "row " << r << " head " << h;
        for (uint8_t b : q) n.subnormal += (b & 0x78) == 0 && (b & 7) != 0;
        const auto& cw = is_v ? v_want : k_want;
        EXPECT_TRUE(close(x, std::vector<float>(cw.begin() + dst, cw.begin() + dst + hd), 2 * Elem<T>::kAtol + sc / 256,
                          0.125 + Elem<T>::kRtol))
            << "row " << r << " head " << h << " against the CPU twin";
        written[size_t(prow * nkv + kh)] = true;
        ++n.rows;
      }
    }
  return written;
}

// The store: qkv as the T store leaves it (bits); each stored k and v row the codec of its T values
// (bits, scales included); the pools' dequantized rows near the CPU twin's (which quantizes its fp32
// rows: the T rounding may move a value across an e4m3 rounding boundary, so within one e4m3 step,
// 2^-3 relative, plus T's tolerance); a zero v row stores scale 1 and zero bytes; nothing else written.
TYPED_TEST(CudaPagedFp8, NormRopeStore) {
  using T = TypeParam;
  for (auto [nh, nkv, hd, ps] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{32, 8, 64, 16},
                                 {4, 2, 128, 64}, {6, 3, 16, 32}}) {
    const int64_t width = (nh + 2 * nkv) * hd, kv = nkv * hd, max_pages = 8, n_pages = 20;
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
    for (int64_t r = 0; r < n_rows; ++r)  // v heads of mixed magnitudes: e4m3 subnormals and underflow
      for (int64_t i = 0; i < kv; ++i) qkv[size_t(r * width + nh * hd + kv + i)] *= std::ldexp(1.f, int(i % 23) - 11);
    std::fill(qkv.begin() + 4 * width + nh * hd + kv, qkv.begin() + 4 * width + nh * hd + kv + hd, 0.f);  // zero v row
    const auto raw = round_to<T>(qkv);
    const size_t pool = size_t(n_pages * ps * kv), scales = size_t(n_pages * ps * nkv);
    DevBuf<T> d_qkv(raw.size()), d_ref(raw.size()), kp(pool), vp(pool);
    DevBuf<uint8_t> k8(pool), v8(pool);
    DevBuf<float> ks(scales), vs(scales), d_qn(qn.size()), d_kn(kn.size()), d_inv(inv.size());
    DevBuf<int32_t> d_table(table.size());
    DevBuf<PagedSeq> d_seqs(seqs.size());
    upload(d_qkv, raw);
    upload(d_ref, raw);
    upload(d_qn, qn);
    upload(d_kn, kn);
    upload(d_inv, inv);
    upload(d_table, table);
    upload(d_seqs, seqs);
    upload(k8, std::vector<uint8_t>(pool, 0x7f));
    upload(v8, std::vector<uint8_t>(pool, 0x7f));
    upload(ks, std::vector<float>(scales, kNaN));
    upload(vs, std::vector<float>(scales, kNaN));
    cuda::qk_norm_rope_store_fp8(d_qkv.get(), k8.get(), v8.get(), ks.get(), vs.get(), d_qn.get(), d_kn.get(),
                                 d_inv.get(), d_seqs.get(), 3, n_rows, d_table.get(), max_pages, ps, nh, nkv, hd, 1e-5f,
                                 this->stream_);
    cuda::qk_norm_rope_store(d_ref.get(), kp.get(), vp.get(), d_qn.get(), d_kn.get(), d_inv.get(), d_seqs.get(), 3,
                             n_rows, d_table.get(), max_pages, ps, nh, nkv, hd, 1e-5f, this->stream_);
    this->sync();
    const auto got = download(d_qkv.get(), raw.size());
    EXPECT_EQ(got, download(d_ref.get(), raw.size())) << "qkv as the T store leaves it";
    std::vector<uint8_t> gk(pool), gv(pool);
    CUDA_CHECK(cudaMemcpy(gk.data(), k8.get(), pool, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gv.data(), v8.get(), pool, cudaMemcpyDeviceToHost));
    const auto gks = download(ks.get(), scales), gvs = download(vs.get(), scales);
    // the CPU twin's dequantized pools
    std::vector<float> want = qkv, k_want(pool, kNaN), v_want(pool, kNaN);
    cpu::qk_norm_rope_store_fp8(want.data(), k_want.data(), v_want.data(), qn.data(), kn.data(), inv.data(),
                                seqs.data(), 3, n_rows, table.data(), max_pages, ps, nh, nkv, hd, 1e-5f, 2);
    StoreCounts n;
    std::vector<bool> written = check_stored<T>(gk, gv, gks, gvs, got, k_want, v_want, seqs, table, max_pages, ps, nh,
                                                nkv, hd, n);
    const int64_t rows_checked = n.rows, subnormal = n.subnormal;
    EXPECT_GT(subnormal, 0) << "the data reach e4m3 subnormals";
    for (size_t i = 0; i < scales; ++i)
      if (!written[i]) {
        ASSERT_TRUE(std::isnan(gks[i]) && std::isnan(gvs[i])) << "scale " << i << " written";
        for (int64_t d = 0; d < hd; ++d) ASSERT_EQ(gk[i * size_t(hd) + size_t(d)], 0x7f) << "byte of scale " << i;
      }
    EXPECT_EQ(rows_checked, 42 * 2 * nkv);
  }
}

}  // namespace
}  // namespace lfm2
