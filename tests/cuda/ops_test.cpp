// Every CUDA op against its CPU twin (or the composition of CPU ops a fused kernel replaces), on
// seeded random data, several shapes including odd ones, in fp32, bf16 and fp16. Inputs are rounded
// to the element type first, so the CPU sees exactly what the GPU sees; tolerances are per dtype
// (cuda_test_util.h). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <type_traits>

#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/add.h"
#include "kernels/attention.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/ops.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_router.h"
#include "kernels/nonfinite.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/short_conv.h"
#include "kernels/swiglu.h"

namespace lfm2 {
namespace {

using namespace test;

template <typename T>
class CudaOps : public CudaTest {};
TYPED_TEST_SUITE(CudaOps, ElemTypes, ElemNames);

TYPED_TEST(CudaOps, Embedding) {
  using T = TypeParam;
  for (auto [n_tokens, vocab, hidden] : {std::tuple<int64_t, int64_t, int64_t>{1, 10, 16}, {37, 100, 33}, {256, 512, 2048}}) {
    auto table = rand_vec(static_cast<size_t>(vocab * hidden), 1);
    auto raw = round_to<T>(table);
    std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) ids[t] = int32_t((t * 7919 + 3) % vocab);
    std::vector<float> ref(static_cast<size_t>(n_tokens * hidden));
    cpu::embedding(ref.data(), ids.data(), table.data(), n_tokens, vocab, hidden);
    DevBuf<T> d_table(raw.size());
    DevBuf<int32_t> d_ids(ids.size());
    DevBuf<float> d_out(ref.size());
    upload(d_table, raw);
    upload(d_ids, ids);
    cuda::embedding(d_out.get(), d_ids.get(), d_table.get(), n_tokens, vocab, hidden, this->stream_);
    this->sync();
    EXPECT_EQ(download(d_out.get(), ref.size()), ref);
  }
}

TYPED_TEST(CudaOps, RmsnormAndFusedAdd) {
  using T = TypeParam;
  const float eps = 1e-5f;
  for (auto [n, dim] : {std::pair<int64_t, int64_t>{1, 2048}, {7, 33}, {64, 100}, {3, 1000}}) {
    auto x = rand_vec(static_cast<size_t>(n * dim), 2, 3.f);
    auto w = rand_vec(static_cast<size_t>(dim), 3);
    auto delta = rand_vec(static_cast<size_t>(n * dim), 4);
    auto delta_raw = round_to<T>(delta);
    DevBuf<float> d_x(x.size()), d_w(w.size());
    DevBuf<T> d_out(x.size()), d_delta(x.size()), d_last(static_cast<size_t>(dim));
    upload(d_x, x);
    upload(d_w, w);
    upload(d_delta, delta_raw);

    std::vector<float> ref(x.size());
    cpu::rmsnorm(ref.data(), x.data(), w.data(), n, dim, eps);
    cuda::rmsnorm(d_out.get(), d_x.get(), d_w.get(), n, dim, eps, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), ref)) << "rmsnorm " << n << "x" << dim;

    // the last row as the last token of one sequence of n tokens
    cuda::rmsnorm_last(d_last.get(), d_x.get(), d_w.get(), 1, n, dim, eps, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_last.get(), static_cast<size_t>(dim)),
                           std::vector<float>(ref.end() - dim, ref.end())));

    std::vector<float> x2(x.size()), ref2(x.size());
    cpu::add(x2.data(), x.data(), delta.data(), int64_t(x.size()));
    cpu::rmsnorm(ref2.data(), x2.data(), w.data(), n, dim, eps);
    cuda::add_rmsnorm(d_out.get(), d_x.get(), d_delta.get(), d_w.get(), n, dim, eps, this->stream_);
    this->sync();
    EXPECT_EQ(download(d_x.get(), x.size()), x2) << "residual after add";
    EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), ref2)) << "add_rmsnorm " << n << "x" << dim;

    // plain add
    upload(d_x, x);
    cuda::add(d_x.get(), d_x.get(), d_delta.get(), int64_t(x.size()), this->stream_);
    this->sync();
    EXPECT_EQ(download(d_x.get(), x.size()), x2);
  }
}

TYPED_TEST(CudaOps, Linear) {
  using T = TypeParam;
  for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 64}, {33, 70, 45}, {128, 256, 192},
                         {5, 2048, 96}, {300, 96, 7}}) {
    auto in = rand_vec(static_cast<size_t>(n * k), 5);
    auto w = rand_vec(static_cast<size_t>(m * k), 6, float(1.0 / std::sqrt(double(k))));
    auto x = rand_vec(static_cast<size_t>(n * m), 29, 4.f);
    auto in_raw = round_to<T>(in);
    auto w_raw = round_to<T>(w);
    std::vector<float> ref(static_cast<size_t>(n * m)), ref_add(ref.size());
    cpu::linear(ref.data(), in.data(), w.data(), n, k, m);
    cpu::add(ref_add.data(), x.data(), ref.data(), n * m);
    DevBuf<T> d_in(in.size()), d_w(w.size()), d_out(ref.size());
    DevBuf<float> d_out32(ref.size()), d_x(x.size());
    upload(d_in, in_raw);
    upload(d_w, w_raw);
    upload(d_x, x);
    cuda::linear(d_out.get(), d_in.get(), d_w.get(), n, k, m, this->stream_);
    cuda::linear_f32out(d_out32.get(), d_in.get(), d_w.get(), n, k, m, this->stream_);
    cuda::linear_add_f32(d_x.get(), d_in.get(), d_w.get(), n, k, m, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), ref)) << n << "x" << k << "x" << m;
    // fp32 output: only the accumulation differs from the CPU
    EXPECT_TRUE(close(download(d_out32.get(), ref.size()), ref, 1e-5, 1e-4)) << n << "x" << k << "x" << m;
    // the residual add fused into the product: x + (in W^T), one rounding of the fp32 sum
    EXPECT_TRUE(close(download(d_x.get(), x.size()), ref_add, 1e-5, 1e-4)) << "add " << n << "x" << k << "x" << m;
  }
}

// Pinned algorithms: the rows of a product come out bit-identical whatever the number of rows
// computed with them (1, 7, 300, 4096 and 9000 rows; the shapes of the model's projections).
TYPED_TEST(CudaOps, LinearRowsBitIdenticalForAnyRowCount) {
  using T = TypeParam;
  ASSERT_TRUE(cuda::gemm_pinning()) << "pinned algorithms are the default (LFM2_GEMM_PIN unset)";
  for (auto [k, m] : {std::pair<int64_t, int64_t>{2048, 6144}, {2048, 2048}, {256, 768}}) {
    const int64_t big = 9000;
    auto in = rand_vec(static_cast<size_t>(big * k), 30);
    auto w = rand_vec(static_cast<size_t>(m * k), 31, float(1.0 / std::sqrt(double(k))));
    DevBuf<T> d_in(in.size()), d_w(w.size()), d_out(static_cast<size_t>(big * m));
    upload(d_in, round_to<T>(in));
    upload(d_w, round_to<T>(w));
    DevBuf<float> d_x(static_cast<size_t>(big * m));
    cuda::linear(d_out.get(), d_in.get(), d_w.get(), big, k, m, this->stream_);
    cuda::linear_f32out(d_x.get(), d_in.get(), d_w.get(), big, k, m, this->stream_);
    this->sync();
    const auto all = download(d_out.get(), static_cast<size_t>(big * m));
    const auto all32 = download(d_x.get(), static_cast<size_t>(big * m));
    for (int64_t rows : {int64_t(1), int64_t(7), int64_t(300), int64_t(4096)}) {
      DevBuf<T> d_part(static_cast<size_t>(rows * m));
      DevBuf<float> d_part32(static_cast<size_t>(rows * m));
      cuda::linear(d_part.get(), d_in.get(), d_w.get(), rows, k, m, this->stream_);
      cuda::linear_f32out(d_part32.get(), d_in.get(), d_w.get(), rows, k, m, this->stream_);
      this->sync();
      EXPECT_EQ(download(d_part.get(), static_cast<size_t>(rows * m)),
                std::vector<float>(all.begin(), all.begin() + rows * m))
          << rows << " of " << big << " rows, " << k << " -> " << m;
      EXPECT_EQ(download(d_part32.get(), static_cast<size_t>(rows * m)),
                std::vector<float>(all32.begin(), all32.begin() + rows * m))
          << "fp32 out: " << rows << " of " << big << " rows, " << k << " -> " << m;
    }
  }
}

TYPED_TEST(CudaOps, QkNormRope) {
  using T = TypeParam;
  const float eps = 1e-5f;
  for (auto [n_seq, S, nh, nkv, hd, theta] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, double>{2, 5, 4, 2, 16, 1e6},
        {1, 37, 8, 8, 64, 1e6}, {3, 70, 6, 2, 32, 1e4}, {1, 3000, 2, 1, 64, 1e6}, {1, 3, 2, 1, 128, 5e5}}) {
    const int64_t T_ = n_seq * S, width = (nh + 2 * nkv) * hd;
    auto qkv = rand_vec(static_cast<size_t>(T_ * width), 7, 2.f);
    auto raw = round_to<T>(qkv);
    auto qn = rand_vec(static_cast<size_t>(hd), 8), kn = rand_vec(static_cast<size_t>(hd), 9);
    std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
    cpu::rope_inv_freq(inv_freq.data(), hd, theta);
    std::vector<int64_t> pos(static_cast<size_t>(T_));
    for (int64_t r = 0; r < T_; ++r) pos[r] = r % S;
    // CPU: split, per-head rmsnorm, rope, then reassemble
    std::vector<float> q(static_cast<size_t>(T_ * nh * hd)), k(static_cast<size_t>(T_ * nkv * hd));
    for (int64_t r = 0; r < T_; ++r) {
      std::copy_n(qkv.begin() + r * width, nh * hd, q.begin() + r * nh * hd);
      std::copy_n(qkv.begin() + r * width + nh * hd, nkv * hd, k.begin() + r * nkv * hd);
    }
    cpu::rmsnorm(q.data(), q.data(), qn.data(), T_ * nh, hd, eps);
    cpu::rmsnorm(k.data(), k.data(), kn.data(), T_ * nkv, hd, eps);
    cpu::rope(q.data(), q.data(), pos.data(), inv_freq.data(), T_, nh, hd);
    cpu::rope(k.data(), k.data(), pos.data(), inv_freq.data(), T_, nkv, hd);
    std::vector<float> ref = qkv;
    for (int64_t r = 0; r < T_; ++r) {
      std::copy_n(q.begin() + r * nh * hd, nh * hd, ref.begin() + r * width);
      std::copy_n(k.begin() + r * nkv * hd, nkv * hd, ref.begin() + r * width + nh * hd);
    }
    DevBuf<T> d_qkv(raw.size());
    DevBuf<float> d_qn(qn.size()), d_kn(kn.size()), d_if(inv_freq.size());
    upload(d_qkv, raw);
    upload(d_qn, qn);
    upload(d_kn, kn);
    upload(d_if, inv_freq);
    cuda::qk_norm_rope(d_qkv.get(), d_qn.get(), d_kn.get(), d_if.get(), n_seq, S, nh, nkv, hd, eps, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_qkv.get(), ref.size()), ref)) << n_seq << "x" << S << " hd " << hd;
  }
}

// Attention against the CPU at shapes (n_seq, S, heads, kv heads, head_dim).
template <typename T>
void check_attention(cudaStream_t stream, int64_t n_seq, int64_t S, int64_t nh, int64_t nkv, int64_t hd) {
  const int64_t T_ = n_seq * S;
  auto q = rand_vec(static_cast<size_t>(T_ * nh * hd), 10, 2.f), k = rand_vec(static_cast<size_t>(T_ * nkv * hd), 11, 2.f),
       v = rand_vec(static_cast<size_t>(T_ * nkv * hd), 12);
  auto qr = round_to<T>(q), kr = round_to<T>(k), vr = round_to<T>(v);
  const float scale = float(std::pow(double(hd), -0.5));
  std::vector<float> ref(q.size()), scratch(static_cast<size_t>(cpu::attention_scratch_floats(S, 0)));
  cpu::attention(ref.data(), q.data(), k.data(), v.data(), n_seq, S, nh, nkv, hd, scale, scratch.data(), 0);
  DevBuf<T> dq(q.size()), dk(k.size()), dv(v.size()), dout(q.size());
  upload(dq, qr);
  upload(dk, kr);
  upload(dv, vr);
  cuda::attention(dout.get(), dq.get(), dk.get(), dv.get(), n_seq, S, nh, nkv, hd, scale, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(close_t<T>(download(dout.get(), ref.size()), ref)) << n_seq << "x" << S << " " << nh << "/" << nkv
                                                                 << " hd " << hd;
}

// Long sequences (the tensor-core kernel's many key tiles and causal skips).
TYPED_TEST(CudaOps, AttentionLong) {
  for (auto [n_seq, S, nh, nkv, hd] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 8192, 1, 1, 64}, {1, 1000, 2, 2, 128},
        {2, 2048, 4, 1, 64}})
    check_attention<TypeParam>(this->stream_, n_seq, S, nh, nkv, hd);
}

TYPED_TEST(CudaOps, Attention) {
  using T = TypeParam;
  for (auto [n_seq, S, nh, nkv, hd] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 1, 2, 1, 16}, {2, 33, 4, 2, 32},
        {1, 100, 8, 2, 64}, {3, 65, 4, 4, 128}, {2, 130, 4, 1, 64}, {48, 32, 8, 2, 64}, {5, 7, 6, 3, 32},
        {3, 31, 4, 2, 16}})
    check_attention<T>(this->stream_, n_seq, S, nh, nkv, hd);
  // strided: q, k, v inside one [q | k | v] row, as the stage calls it
  const int64_t n_seq = 2, S = 45, nh = 4, nkv = 2, hd = 64, width = (nh + 2 * nkv) * hd;
  auto qkv = rand_vec(static_cast<size_t>(n_seq * S * width), 13, 2.f);
  auto raw = round_to<T>(qkv);
  std::vector<float> q, k, v;
  for (int64_t r = 0; r < n_seq * S; ++r) {
    q.insert(q.end(), qkv.begin() + r * width, qkv.begin() + r * width + nh * hd);
    k.insert(k.end(), qkv.begin() + r * width + nh * hd, qkv.begin() + r * width + (nh + nkv) * hd);
    v.insert(v.end(), qkv.begin() + r * width + (nh + nkv) * hd, qkv.begin() + (r + 1) * width);
  }
  std::vector<float> ref(q.size()), scratch(static_cast<size_t>(cpu::attention_scratch_floats(S, 1)));
  cpu::attention(ref.data(), q.data(), k.data(), v.data(), n_seq, S, nh, nkv, hd, 0.125f, scratch.data(), 1);
  DevBuf<T> d_qkv(raw.size()), dout(q.size());
  upload(d_qkv, raw);
  cuda::attention(dout.get(), d_qkv.get(), d_qkv.get() + nh * hd, d_qkv.get() + (nh + nkv) * hd, n_seq, S, nh, nkv,
                  hd, 0.125f, this->stream_, width, width);
  this->sync();
  EXPECT_TRUE(close_t<T>(download(dout.get(), ref.size()), ref)) << "strided";
}

TYPED_TEST(CudaOps, ShortConv) {
  using T = TypeParam;
  // 3 taps on 16-byte rows: the windowed kernel (a sequence's last rows past a multiple of 4, a
  // sequence of 1 and 2 rows); else the per-row one
  for (auto [n_seq, S, H, L] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 9, 64, 3}, {1, 1, 33, 3},
                                {3, 40, 100, 4}, {4, 32, 2048, 3}, {5, 1, 64, 3}, {3, 2, 128, 3},
                                {3, 7, 256, 4}}) {
    const int64_t T_ = n_seq * S;
    auto bcx = rand_vec(static_cast<size_t>(T_ * 3 * H), 14, 2.f), w = rand_vec(static_cast<size_t>(H * L), 15);
    auto raw = round_to<T>(bcx);
    std::vector<float> ref(static_cast<size_t>(T_ * H));
    cpu::short_conv(ref.data(), bcx.data(), w.data(), n_seq, S, H, L);
    DevBuf<T> d_bcx(raw.size()), d_out(ref.size());
    DevBuf<float> d_w(w.size());
    upload(d_bcx, raw);
    upload(d_w, w);
    cuda::short_conv(d_out.get(), d_bcx.get(), d_w.get(), n_seq, S, H, L, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), ref)) << n_seq << "x" << S << " H " << H;
  }
}

TYPED_TEST(CudaOps, Swiglu) {
  using T = TypeParam;
  for (auto [n, inter] : {std::pair<int64_t, int64_t>{7, 33}, {64, 1792}, {1, 1}}) {
    auto gu = rand_vec(static_cast<size_t>(n * 2 * inter), 16, 6.f);
    auto raw = round_to<T>(gu);
    std::vector<float> ref(static_cast<size_t>(n * inter));
    for (int64_t r = 0; r < n; ++r)
      cpu::swiglu(ref.data() + r * inter, gu.data() + r * 2 * inter, gu.data() + r * 2 * inter + inter, inter);
    DevBuf<T> d_gu(raw.size()), d_out(ref.size());
    upload(d_gu, raw);
    cuda::swiglu(d_out.get(), d_gu.get(), n, inter, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), ref)) << n << "x" << inter;
    // the same rows interleaved [g0, u0, g1, u1, ...]
    std::vector<T> pairs(raw.size());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < inter; ++j) {
        pairs[(r * inter + j) * 2] = raw[r * 2 * inter + j];
        pairs[(r * inter + j) * 2 + 1] = raw[r * 2 * inter + inter + j];
      }
    DevBuf<T> d_pairs(pairs.size()), d_out2(ref.size());
    upload(d_pairs, pairs);
    cuda::swiglu_pairs(d_out2.get(), d_pairs.get(), n, inter, this->stream_);
    this->sync();
    EXPECT_TRUE(close_t<T>(download(d_out2.get(), ref.size()), ref)) << "pairs " << n << "x" << inter;
  }
}

// Routed experts composed on the GPU against cpu::moe_experts + cpu::add. Routings: spread (distinct
// experts per token, every expert used), few (only experts 1 and E-2: the others get zero tokens),
// one (every token's first pick is expert E/2 and the rest distinct: one expert holds all tokens).
enum class Routing { kSpread, kFew, kOne };

// x + cpu::moe_experts(in): the reference of cuda::moe_experts (w1, w3 split out of w13).
std::vector<float> moe_reference(const std::vector<float>& x, const std::vector<float>& in, const std::vector<float>& w1,
                                 const std::vector<float>& w3, const std::vector<float>& w2,
                                 const std::vector<int32_t>& experts, const std::vector<float>& weights, int64_t n,
                                 int64_t H, int64_t E, int64_t I, int64_t k) {
  const auto need = cpu::moe_experts_scratch(n, H, E, I, k, 1);
  std::vector<float> fs(static_cast<size_t>(need.floats)), moe(static_cast<size_t>(n * H)), ref(moe.size());
  std::vector<int32_t> is(static_cast<size_t>(need.ints));
  cpu::moe_experts(moe.data(), in.data(), w1.data(), w3.data(), w2.data(), experts.data(), weights.data(), n, H, E, I,
                   k, fs.data(), is.data(), 1);
  cpu::add(ref.data(), x.data(), moe.data(), n * H);
  return ref;
}

// cuda::moe_experts on uploaded copies, x coming back; the scratch starts as `fill` bytes.
template <typename T>
std::vector<float> moe_on_device(const std::vector<float>& x, const std::vector<T>& in, const std::vector<T>& w13,
                                 const std::vector<T>& w2, const std::vector<int32_t>& experts,
                                 const std::vector<float>& weights, int64_t n, int64_t H, int64_t E, int64_t I,
                                 int64_t k, cudaStream_t stream, int fill = 0) {
  DevBuf<T> d_in(in.size()), d_w13(w13.size()), d_w2(w2.size());
  DevBuf<float> d_x(x.size()), d_w(weights.size());
  DevBuf<int32_t> d_e(experts.size());
  const size_t scratch = static_cast<size_t>(cuda::moe_experts_scratch_bytes(n, H, E, I, k, sizeof(T)));
  DevBuf<char> d_scratch(scratch);
  CUDA_CHECK(cudaMemset(d_scratch.get(), fill, scratch));
  upload(d_in, in);
  upload(d_w13, w13);
  upload(d_w2, w2);
  upload(d_x, x);
  upload(d_w, weights);
  upload(d_e, experts);
  cuda::moe_experts(d_x.get(), d_in.get(), d_w13.get(), d_w2.get(), d_e.get(), d_w.get(), n, H, E, I, k,
                    d_scratch.get(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(d_x.get(), x.size());
}

TYPED_TEST(CudaOps, MoeExperts) {
  using T = TypeParam;
  struct Case {
    int64_t n, H, E, I, k;
    Routing routing;
  };
  for (const Case c : {Case{37, 64, 8, 48, 2, Routing::kSpread}, Case{200, 128, 32, 96, 4, Routing::kSpread},
                       Case{5, 64, 4, 40, 4, Routing::kSpread}, Case{300, 40, 7, 24, 1, Routing::kSpread},
                       Case{1, 256, 32, 64, 4, Routing::kSpread}, Case{1, 64, 5, 32, 1, Routing::kSpread},
                       Case{150, 64, 33, 32, 2, Routing::kFew}, Case{257, 128, 9, 64, 3, Routing::kOne},
                       Case{513, 64, 32, 48, 1, Routing::kOne}}) {
    const auto [n, H, E, I, k, routing] = c;
    auto in = rand_vec(static_cast<size_t>(n * H), 17);
    auto w1 = rand_vec(static_cast<size_t>(E * I * H), 18, float(1 / std::sqrt(double(H))));
    auto w3 = rand_vec(static_cast<size_t>(E * I * H), 19, float(1 / std::sqrt(double(H))));
    auto w2 = rand_vec(static_cast<size_t>(E * H * I), 20, float(1 / std::sqrt(double(I))));
    auto x = rand_vec(static_cast<size_t>(n * H), 21);
    auto in_raw = round_to<T>(in);
    round_to<T>(w1), round_to<T>(w3), round_to<T>(w2);
    std::vector<int32_t> experts(static_cast<size_t>(n * k));
    std::vector<float> weights(static_cast<size_t>(n * k));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) {
        int32_t e = 0;
        switch (routing) {
          case Routing::kSpread: e = int32_t((t * 5 + j * (E / k + 1) + (t % 3)) % E); break;  // distinct for j < k
          case Routing::kFew: e = int32_t(j == 0 ? ((t % 2) ? 1 : E - 2) : ((t % 2) ? E - 2 : 1)); break;
          case Routing::kOne: e = int32_t((E / 2 + j * (1 + t % (E / k))) % E); break;
        }
        experts[t * k + j] = e;
        weights[t * k + j] = 0.1f + 0.2f * float((t + j) % 5);
      }
    // w13 (E, 2I, H): each expert's w1 rows then its w3 rows
    std::vector<float> w13(static_cast<size_t>(E * 2 * I * H));
    for (int64_t e = 0; e < E; ++e) {
      std::copy_n(w1.begin() + e * I * H, I * H, w13.begin() + e * 2 * I * H);
      std::copy_n(w3.begin() + e * I * H, I * H, w13.begin() + e * 2 * I * H + I * H);
    }
    auto w13_raw = round_to<T>(w13);
    auto w2_raw = round_to<T>(w2);

    const auto ref = moe_reference(x, in, w1, w3, w2, experts, weights, n, H, E, I, k);
    const auto got = moe_on_device<T>(x, in_raw, w13_raw, w2_raw, experts, weights, n, H, E, I, k, this->stream_);
    // bf16/fp16 round gate/up, the activation and the expert outputs: three roundings
    EXPECT_TRUE(close_t<T>(got, ref, 3))
        << n << " tokens, H " << H << ", " << E << " experts, I " << I << ", top " << k << ", routing "
        << int(routing);
  }
}

// Generation's finished rows: pairs of expert -1 add nothing (the row of x stays as it was) and
// leave the other rows as the CPU gives them; also when every pair of the batch is dropped.
TYPED_TEST(CudaOps, MoeExpertsDroppedRows) {
  using T = TypeParam;
  const int64_t H = 64, E = 8, I = 48, k = 2;
  for (const int64_t n : {int64_t(37), int64_t(3)}) {
    auto in = rand_vec(static_cast<size_t>(n * H), 51);
    auto w13 = rand_vec(static_cast<size_t>(E * 2 * I * H), 52, float(1 / std::sqrt(double(H))));
    auto w2 = rand_vec(static_cast<size_t>(E * H * I), 53, float(1 / std::sqrt(double(I))));
    auto x = rand_vec(static_cast<size_t>(n * H), 54);
    auto in_raw = round_to<T>(in);
    auto w13_raw = round_to<T>(w13);
    auto w2_raw = round_to<T>(w2);
    std::vector<float> w1(static_cast<size_t>(E * I * H)), w3(w1.size());
    for (int64_t e = 0; e < E; ++e) {
      std::copy_n(w13.begin() + e * 2 * I * H, I * H, w1.begin() + e * I * H);
      std::copy_n(w13.begin() + e * 2 * I * H + I * H, I * H, w3.begin() + e * I * H);
    }
    std::vector<int32_t> experts(static_cast<size_t>(n * k));
    std::vector<float> weights(experts.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const bool dropped = n == 3 || t % 3 == 1;  // n = 3: the whole batch has finished
        experts[size_t(t * k + j)] = dropped ? -1 : int32_t((t * 3 + j * 5) % E);
        weights[size_t(t * k + j)] = 0.25f + 0.1f * float(j);
      }
    const auto ref = moe_reference(x, in, w1, w3, w2, experts, weights, n, H, E, I, k);
    // stale indices in the scratch, as a reused one has
    const auto got = moe_on_device<T>(x, in_raw, w13_raw, w2_raw, experts, weights, n, H, E, I, k, this->stream_, 0x7f);
    EXPECT_TRUE(close_t<T>(got, ref, 3)) << n << " tokens";
    for (int64_t t = 0; t < n; ++t) {
      if (experts[size_t(t * k)] >= 0) continue;
      EXPECT_TRUE(std::equal(got.begin() + t * H, got.begin() + (t + 1) * H, x.begin() + t * H)) << "row " << t;
    }
  }
}

// ---------------------------------------------------------------- dtype-free ops

class CudaNonfinite : public CudaTest {};

// The per-microbatch NaN/Inf check: the device count equals the CPU count, for sizes below one
// block, across the grid-stride limit, and with NaN, +Inf and -Inf mixed in (or none).
TEST_F(CudaNonfinite, CountMatchesCpu) {
  const float nan = std::nanf(""), inf = INFINITY;
  for (auto [n, n_bad] : {std::pair<int64_t, int64_t>{1, 0}, {1, 1}, {255, 3}, {4097, 0}, {300000, 17}, {1 << 22, 1000}}) {
    auto x = rand_vec(static_cast<size_t>(n), 41, 100.f);
    std::vector<char> bad(size_t(n), 0);
    for (int64_t i = 0; i < n_bad; ++i) {
      const size_t at = size_t((i * 7919 + 11) % n);
      x[at] = i % 3 == 0 ? nan : i % 3 == 1 ? inf : -inf;
      bad[at] = 1;
    }
    const int64_t placed = std::count(bad.begin(), bad.end(), 1);
    ASSERT_EQ(cpu::count_nonfinite(x.data(), n), placed) << n << " values";
    DevBuf<float> d_x(x.size());
    DevBuf<unsigned int> d_count(1);
    upload(d_x, x);
    upload(d_count, std::vector<unsigned int>{0});
    cuda::count_nonfinite(d_count.get(), d_x.get(), n, stream_);
    sync();
    unsigned int got = 0;
    CUDA_CHECK(cudaMemcpy(&got, d_count.get(), sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_EQ(int64_t(got), placed) << n << " values";
  }
}

class CudaMoe : public CudaTest {};

TEST_F(CudaMoe, RouterMatchesCpu) {
  for (auto [n, E, k, norm, scale, bias] :
       {std::tuple<int64_t, int64_t, int64_t, bool, float, bool>{37, 32, 4, true, 1.f, true},
        {100, 8, 1, false, 2.5f, false}, {5, 64, 8, true, 1.f, true}, {50, 1024, 4, true, 1.f, true},
        {3, 33, 32, false, 1.f, true}, {1000, 32, 4, true, 1.f, true}}) {
    auto logits = rand_vec(static_cast<size_t>(n * E), 22, 4.f);
    auto b = rand_vec(static_cast<size_t>(E), 23, 0.5f);
    // exact ties: in every 8th token, copy a logit onto its neighbour
    for (int64_t t = 0; t < n; t += 8)
      if (E > 1) logits[t * E + 1] = logits[t * E];
    if (bias) b[1] = b[0];
    std::vector<float> w(static_cast<size_t>(n * k));
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    cpu::moe_router(w.data(), ids.data(), logits.data(), bias ? b.data() : nullptr, n, E, k, norm, scale);
    DevBuf<float> d_logits(logits.size()), d_b(b.size()), d_w(w.size());
    DevBuf<int32_t> d_ids(ids.size());
    upload(d_logits, logits);
    upload(d_b, b);
    cuda::moe_router(d_w.get(), d_ids.get(), d_logits.get(), bias ? d_b.get() : nullptr, n, E, k, norm, scale,
                     stream_);
    sync();
    EXPECT_EQ(int_download(d_ids.get(), ids.size()), ids) << n << " tokens, " << E << " experts, top " << k;
    EXPECT_TRUE(close(download(d_w.get(), w.size()), w, 1e-7, 1e-6));
  }
  // top_k past the warp's 32 picks is refused, not silently wrong
  DevBuf<float> d_l(33), d_w(33);
  DevBuf<int32_t> d_i(33);
  EXPECT_THROW(cuda::moe_router(d_w.get(), d_i.get(), d_l.get(), nullptr, 1, 33, 33, true, 1.f, stream_), Error);
}

// NaN logits (NaN weights upstream) still route every token to valid, distinct experts, the CPU's:
// NaN ranks as -inf. Fewer experts than lanes too (a lane with none must not read past the row).
TEST_F(CudaMoe, RouterWithNaNLogitsPicksValidExperts) {
  for (auto [n, E, k] : {std::tuple<int64_t, int64_t, int64_t>{6, 4, 2}, {6, 8, 2}, {9, 32, 4}, {4, 64, 8}}) {
    auto logits = rand_vec(static_cast<size_t>(n * E), 24, 4.f);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t x = 0; x < E; ++x)
        if (t % 3 == 0 || (t % 3 == 1 && x % 2 == 1)) logits[size_t(t * E + x)] = NAN;  // all / half NaN
    std::vector<float> w(static_cast<size_t>(n * k));
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    cpu::moe_router(w.data(), ids.data(), logits.data(), nullptr, n, E, k, true, 1.f);
    for (int64_t t = 0; t < n; t += 3)
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(ids[size_t(t * k + j)], j);  // all NaN: the lowest indices
    DevBuf<float> d_logits(logits.size()), d_w(w.size());
    DevBuf<int32_t> d_ids(ids.size());
    upload(d_logits, logits);
    cuda::moe_router(d_w.get(), d_ids.get(), d_logits.get(), nullptr, n, E, k, true, 1.f, stream_);
    sync();
    EXPECT_EQ(int_download(d_ids.get(), ids.size()), ids) << n << " tokens, " << E << " experts, top " << k;
  }
}

// The permutation against a host counting sort: stable by (token, slot) within each expert.
TEST_F(CudaMoe, PermuteIsStableCountingSort) {
  for (auto [n, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4, 1}, {37, 32, 4}, {1000, 32, 4},
                         {3000, 256, 8}, {10, 1024, 2}, {4096, 32, 4}}) {
    const int64_t P = n * k;
    std::vector<int32_t> ex(static_cast<size_t>(P));
    CounterRng rng(7, uint64_t(n * 131 + E));
    for (int64_t i = 0; i < P; ++i) ex[i] = int32_t(rng.bits(uint64_t(i)) % uint64_t(E / 2 + 1));  // skewed, some empty
    std::vector<int32_t> off(static_cast<size_t>(E + 1), 0), src(static_cast<size_t>(P)), dest(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) ++off[ex[i] + 1];
    for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
    std::vector<int32_t> cur(off.begin(), off.end() - 1);
    for (int64_t i = 0; i < P; ++i) {
      const int32_t row = cur[ex[i]]++;
      src[row] = int32_t(i / k);
      dest[i] = row;
    }
    DevBuf<int32_t> d_ex(ex.size()), d_off(off.size()), d_src(src.size()), d_dest(dest.size()),
        d_scratch(static_cast<size_t>(cuda::moe_permute_scratch_ints(n, E, k)));
    upload(d_ex, ex);
    cuda::moe_permute(d_off.get(), d_src.get(), d_dest.get(), d_ex.get(), n, E, k, d_scratch.get(), stream_);
    sync();
    auto get = [](const DevBuf<int32_t>& d) {
      std::vector<int32_t> h(d.size());
      CUDA_CHECK(cudaMemcpy(h.data(), d.get(), h.size() * 4, cudaMemcpyDeviceToHost));
      return h;
    };
    EXPECT_EQ(get(d_off), off) << n << " tokens, " << E << " experts, top " << k;
    EXPECT_EQ(get(d_src), src);
    EXPECT_EQ(get(d_dest), dest);
  }
}

template <typename T>
class CudaGrouped : public CudaTest {};
TYPED_TEST_SUITE(CudaGrouped, ElemTypes, ElemNames);

// Grouped GEMM against cpu::linear row by row: ragged groups (some empty), odd expert counts, one
// row, every row on one expert; unaligned K and N for fp32 (the SIMT kernel takes any shape). For
// bf16/fp16 every CUTLASS tile configuration runs, and all must give the same bits.
struct GroupedCase {
  int64_t rows, E, K, N;
  int only_expert;  // >= 0: every row on this expert
};

std::vector<int32_t> grouped_offsets(const GroupedCase& c) {
  std::vector<int32_t> off(static_cast<size_t>(c.E + 1), 0);
  for (int64_t e = 0; e < c.E; ++e) {
    int64_t n = 0;
    if (c.only_expert >= 0)
      n = e == c.only_expert ? c.rows : 0;
    else
      n = (e % 3 == 1) ? 0 : c.rows * (e + 1) / (c.E * 2) + 3;
    off[e + 1] = int32_t(std::min<int64_t>(c.rows, off[e] + n));
  }
  off[c.E] = int32_t(c.rows);
  return off;
}

TYPED_TEST(CudaGrouped, MatchesLinearPerExpert) {
  using T = TypeParam;
  std::vector<GroupedCase> cases = {{200, 8, 64, 96, -1},   {37, 5, 40, 32, -1},     {300, 4, 48, 56, -1},
                                    {1000, 32, 256, 384, -1}, {129, 1, 2048, 136, -1}, {1, 3, 64, 64, -1},
                                    {513, 7, 128, 64, 3},    {4096, 32, 2048, 512, -1}};
  const bool f32 = std::is_same<T, float>::value;
  if (f32) cases.insert(cases.end(), {{37, 5, 40, 33, -1}, {300, 4, 37, 50, -1}});
  const int n_configs = f32 ? 1 : cuda::grouped::kGroupedConfigCount;
  for (const GroupedCase& c : cases) {
    const auto [rows, E, K, N, only] = c;
    auto in = rand_vec(static_cast<size_t>(rows * K), 24);
    auto w = rand_vec(static_cast<size_t>(E * N * K), 25, float(1 / std::sqrt(double(K))));
    auto in_raw = round_to<T>(in);
    auto w_raw = round_to<T>(w);
    const auto off = grouped_offsets(c);
    std::vector<float> ref(static_cast<size_t>(rows * N));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = off[e]; r < off[e + 1]; ++r)
        cpu::linear(ref.data() + r * N, in.data() + r * K, w.data() + e * N * K, 1, K, N);
    DevBuf<T> d_in(in.size()), d_w(w.size());
    DevBuf<int32_t> d_off(off.size());
    DevBuf<char> d_ws(static_cast<size_t>(cuda::moe_grouped_matmul_workspace_bytes(E)));
    upload(d_in, in_raw);
    upload(d_w, w_raw);
    upload(d_off, off);
    std::vector<float> first;
    for (int cfg = 0; cfg < n_configs; ++cfg) {
      if (!f32) cuda::grouped::force_config(cfg);
      DevBuf<T> d_out(ref.size());
      cuda::moe_grouped_matmul(d_out.get(), d_in.get(), d_w.get(), d_off.get(), rows, E, K, N, d_ws.get(),
                               this->stream_);
      this->sync();
      const auto got = download(d_out.get(), ref.size());
      const char* name = f32 ? "simt" : cuda::grouped::kGroupedTiles[cfg].name;
      EXPECT_TRUE(close_t<T>(got, ref)) << rows << " rows, " << E << " experts, K " << K << ", N " << N << ", "
                                        << name;
      if (cfg == 0)
        first = got;
      else
        EXPECT_EQ(got, first) << "config " << name << " differs in bits from " << cuda::grouped::kGroupedTiles[0].name;
    }
    if (!f32) cuda::grouped::force_config(-1);
  }
}

// The gate/up product with SwiGLU in the CUTLASS epilogue (bf16/fp16), against cpu::linear per
// expert on the interleaved w13 then cpu::swiglu; both fused configurations, bit-equal.
TYPED_TEST(CudaGrouped, SwigluFusedMatchesCpu) {
  using T = TypeParam;
  if (std::is_same<T, float>::value) GTEST_SKIP() << "fp32 runs the SIMT product and swiglu_pairs";
  if constexpr (!std::is_same<T, float>::value) {
    for (const GroupedCase& c : std::vector<GroupedCase>{{200, 8, 64, 96, -1}, {37, 5, 40, 32, -1},
                                                         {1, 3, 64, 64, -1}, {513, 7, 128, 64, 3},
                                                         {4096, 32, 2048, 256, -1}}) {
      const auto [rows, E, K, N, only] = c;  // N = 2 * inter
      const int64_t inter = N / 2;
      auto in = rand_vec(static_cast<size_t>(rows * K), 35);
      auto w = rand_vec(static_cast<size_t>(E * N * K), 36, float(2 / std::sqrt(double(K))));
      auto in_raw = round_to<T>(in);
      auto w_raw = round_to<T>(w);
      const auto off = grouped_offsets(c);
      std::vector<float> ref(static_cast<size_t>(rows * inter)), gu(static_cast<size_t>(N)), g(static_cast<size_t>(inter)),
          u(static_cast<size_t>(inter));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = off[e]; r < off[e + 1]; ++r) {
          cpu::linear(gu.data(), in.data() + r * K, w.data() + e * N * K, 1, K, N);
          for (int64_t j = 0; j < inter; ++j) g[j] = gu[2 * j], u[j] = gu[2 * j + 1];
          cpu::swiglu(ref.data() + r * inter, g.data(), u.data(), inter);
        }
      DevBuf<T> d_in(in.size()), d_w(w.size());
      DevBuf<int32_t> d_off(off.size());
      DevBuf<char> d_ws(static_cast<size_t>(cuda::moe_grouped_matmul_workspace_bytes(E)));
      upload(d_in, in_raw);
      upload(d_w, w_raw);
      upload(d_off, off);
      std::vector<float> first;
      for (int cfg : {0, 1}) {
        cuda::grouped::force_config(cfg);
        DevBuf<T> d_act(ref.size());
        cuda::moe_grouped_swiglu(d_act.get(), d_in.get(), d_w.get(), d_off.get(), rows, E, K, inter, d_ws.get(),
                                 this->stream_);
        this->sync();
        const auto got = download(d_act.get(), ref.size());
        // one rounding (the output) from fp32 accumulators
        EXPECT_TRUE(close_t<T>(got, ref)) << rows << " rows, " << E << " experts, K " << K << ", inter " << inter
                                          << ", " << cuda::grouped::kGroupedTiles[cfg].name;
        if (cfg == 0)
          first = got;
        else
          EXPECT_EQ(got, first) << "fused configurations differ in bits";
      }
      cuda::grouped::force_config(-1);
    }
  }
}

// A row's bits do not depend on the batch: one expert's rows computed alone (a problem of those rows
// only, at offset 0) equal the same rows inside the full grouped product.
TYPED_TEST(CudaGrouped, RowsBitIdenticalForAnyBatch) {
  using T = TypeParam;
  const GroupedCase c{2000, 8, 512, 256, -1};
  const auto off = grouped_offsets(c);
  auto in = rand_vec(static_cast<size_t>(c.rows * c.K), 32);
  auto w = rand_vec(static_cast<size_t>(c.E * c.N * c.K), 33, float(1 / std::sqrt(double(c.K))));
  DevBuf<T> d_in(in.size()), d_w(w.size()), d_out(static_cast<size_t>(c.rows * c.N));
  DevBuf<int32_t> d_off(off.size());
  DevBuf<char> d_ws(static_cast<size_t>(cuda::moe_grouped_matmul_workspace_bytes(c.E)));
  upload(d_in, round_to<T>(in));
  upload(d_w, round_to<T>(w));
  upload(d_off, off);
  cuda::moe_grouped_matmul(d_out.get(), d_in.get(), d_w.get(), d_off.get(), c.rows, c.E, c.K, c.N, d_ws.get(),
                           this->stream_);
  this->sync();
  const auto all = download(d_out.get(), static_cast<size_t>(c.rows * c.N));
  for (int64_t e : {int64_t(0), int64_t(5), int64_t(6)}) {  // (experts 1, 4, 7 have no rows)
    const int64_t r0 = off[e], n = off[e + 1] - r0;
    ASSERT_GT(n, 0);
    // expert e alone: offsets with every other expert empty, rows moved to the front
    std::vector<int32_t> solo(static_cast<size_t>(c.E + 1), 0);
    for (int64_t x = e + 1; x <= c.E; ++x) solo[x] = int32_t(n);
    DevBuf<int32_t> d_solo(solo.size());
    DevBuf<T> d_out1(static_cast<size_t>(n * c.N));
    upload(d_solo, solo);
    cuda::moe_grouped_matmul(d_out1.get(), d_in.get() + r0 * c.K, d_w.get(), d_solo.get(), n, c.E, c.K, c.N,
                             d_ws.get(), this->stream_);
    this->sync();
    EXPECT_EQ(download(d_out1.get(), static_cast<size_t>(n * c.N)),
              std::vector<float>(all.begin() + r0 * c.N, all.begin() + (r0 + n) * c.N))
        << "expert " << e << ": " << n << " rows alone vs inside " << c.rows;
  }
}

TYPED_TEST(CudaGrouped, GatherCopiesRows) {
  using T = TypeParam;
  for (auto [n_tok, rows, H] : {std::tuple<int64_t, int64_t, int64_t>{50, 200, 72}, {3, 5, 37}, {1, 4, 2048}}) {
    auto in = rand_vec(static_cast<size_t>(n_tok * H), 34);
    auto raw = round_to<T>(in);
    std::vector<int32_t> src(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) src[r] = int32_t((r * 7 + 3) % n_tok);
    std::vector<float> ref(static_cast<size_t>(rows * H));
    for (int64_t r = 0; r < rows; ++r) std::copy_n(in.begin() + src[r] * H, H, ref.begin() + r * H);
    DevBuf<T> d_in(raw.size()), d_out(ref.size());
    DevBuf<int32_t> d_src(src.size());
    upload(d_in, raw);
    upload(d_src, src);
    cuda::moe_gather(d_out.get(), d_in.get(), d_src.get(), rows, H, this->stream_);
    this->sync();
    EXPECT_EQ(download(d_out.get(), ref.size()), ref) << rows << " rows of " << H;
  }
}

// bf16/fp16 need 16-byte rows (TMA): other shapes are refused, not computed wrongly.
TEST(CudaGroupedRefusal, UnalignedSixteenBitShapesAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DevBuf<__nv_bfloat16> d_in(64 * 40), d_w(2 * 40 * 40), d_out(64 * 40);
  DevBuf<int32_t> d_off(3);
  DevBuf<char> d_ws(static_cast<size_t>(cuda::moe_grouped_matmul_workspace_bytes(2)));
  EXPECT_THROW(cuda::moe_grouped_matmul(d_out.get(), d_in.get(), d_w.get(), d_off.get(), 64, 2, 37, 40, d_ws.get(),
                                        nullptr),
               Error);
  EXPECT_THROW(cuda::moe_grouped_matmul(d_out.get(), d_in.get(), d_w.get(), d_off.get(), 64, 2, 40, 33, d_ws.get(),
                                        nullptr),
               Error);
}

TYPED_TEST(CudaGrouped, CombineSumsInExpertOrder) {
  using T = TypeParam;
  const int64_t n = 50, k = 4, H = 72, P = n * k;
  auto y = rand_vec(static_cast<size_t>(P * H), 26);
  auto y_raw = round_to<T>(y);
  auto x = rand_vec(static_cast<size_t>(n * H), 27);
  auto w = rand_vec(static_cast<size_t>(P), 28);
  std::vector<int32_t> dest(static_cast<size_t>(P));
  std::iota(dest.begin(), dest.end(), 0);
  for (int64_t i = 0; i < P; ++i) std::swap(dest[i], dest[(i * 7919) % P]);  // a permutation
  std::vector<float> ref = x;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<std::pair<int32_t, float>> s;
    for (int64_t j = 0; j < k; ++j) s.push_back({dest[t * k + j], w[t * k + j]});
    std::sort(s.begin(), s.end());
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0;
      for (auto [row, wt] : s) acc += y[int64_t(row) * H + c] * wt;
      ref[t * H + c] += acc;
    }
  }
  DevBuf<T> d_y(y.size());
  DevBuf<float> d_x(x.size()), d_w(w.size());
  DevBuf<int32_t> d_dest(dest.size());
  upload(d_y, y_raw);
  upload(d_x, x);
  upload(d_w, w);
  upload(d_dest, dest);
  cuda::moe_combine(d_x.get(), d_y.get(), d_dest.get(), d_w.get(), n, k, H, this->stream_);
  this->sync();
  EXPECT_TRUE(close(download(d_x.get(), x.size()), ref, 1e-6, 1e-6));
}

// moe_combine_norm: the bits of moe_combine, then rmsnorm (no e4m3) or rmsnorm_quantize_e4m3 with
// first_q 0 (16-bit), per row and per 128 columns, with and without the T out; a dropped pair, a
// large value; widths from one group to the widest (a zero row's scale: row_norm's write_row, tested
// through rmsnorm_quantize_e4m3 in linear_fp8_test).
TYPED_TEST(CudaGrouped, CombineNormEqualsCombineThenNorm) {
  using T = TypeParam;
  const int64_t k = 4;
  for (const int64_t H : {128, 640, 2048, 8192})
    for (const int64_t n : {1, 37}) {
      SCOPED_TRACE(cat(n, " tokens, hidden ", H));
      const int64_t P = n * k, G = H / 128;
      auto y_f = rand_vec(size_t(P * H), 30 + uint64_t(H), 3.f);
      const auto y = round_to<T>(y_f);
      auto x = rand_vec(size_t(n * H), 31, 2.f);
      x[size_t((n - 1) * H + 5)] = 1e3f;
      const auto w = rand_vec(size_t(P), 32);
      const auto nw = rand_vec(size_t(H), 33, 2.f);
      std::vector<int32_t> dest(static_cast<size_t>(P));
      std::iota(dest.begin(), dest.end(), 0);
      for (int64_t i = 0; i < P; ++i) std::swap(dest[size_t(i)], dest[size_t((i * 7919) % P)]);
      dest[0] = -1;  // a dropped pair
      DevBuf<T> d_y(y.size()), d_out(x.size()), d_ref(x.size());
      DevBuf<float> d_x(x.size()), d_xr(x.size()), d_w(w.size()), d_nw(nw.size()), d_s(size_t(n * G)),
          d_sr(size_t(n * G));
      DevBuf<uint8_t> d_q(x.size()), d_qr(x.size());
      DevBuf<int32_t> d_dest(dest.size());
      upload(d_y, y);
      upload(d_w, w);
      upload(d_nw, nw);
      upload(d_dest, dest);
      const bool e4m3 = sizeof(T) == 2;
      for (const int form : {0, 1, 2}) {  // 0: T out only; 1: + codes per 128 columns; 2: codes per row, no out
        if (form > 0 && !e4m3) continue;
        SCOPED_TRACE(cat("form ", form));
        upload(d_x, x);
        upload(d_xr, x);
        CUDA_CHECK(cudaMemsetAsync(d_out.get(), 0, x.size() * sizeof(T), this->stream_));
        CUDA_CHECK(cudaMemsetAsync(d_ref.get(), 0, x.size() * sizeof(T), this->stream_));
        cuda::moe_combine(d_xr.get(), d_y.get(), d_dest.get(), d_w.get(), n, k, H, this->stream_);
        cuda::NextNorm<T> next{d_nw.get(), 1e-5f, form == 2 ? nullptr : d_out.get()};
        if (form == 0) {
          cuda::rmsnorm(d_ref.get(), d_xr.get(), d_nw.get(), n, H, 1e-5f, this->stream_);
        } else {
          if constexpr (sizeof(T) == 2)
            cuda::rmsnorm_quantize_e4m3(d_ref.get(), d_qr.get(), d_sr.get(), d_xr.get(), d_nw.get(), n, 0, H, 1e-5f,
                                        form == 2, this->stream_, form != 2);
          next.q = d_q.get(), next.scales = d_s.get(), next.per_row = form == 2;
        }
        cuda::moe_combine_norm(d_x.get(), d_y.get(), d_dest.get(), d_w.get(), n, k, H, next, this->stream_);
        this->sync();
        EXPECT_TRUE(same_bits(download(d_x.get(), x.size()), download(d_xr.get(), x.size()))) << "x";
        EXPECT_TRUE(same_bits(download(d_out.get(), x.size()), download(d_ref.get(), x.size()))) << "out";
        if (form == 0) continue;
        EXPECT_EQ(byte_download(d_q.get(), x.size()), byte_download(d_qr.get(), x.size())) << "codes";
        EXPECT_TRUE(same_bits(download(d_s.get(), size_t(n * G)), download(d_sr.get(), size_t(n * G)))) << "scales";
      }
    }
}

}  // namespace
}  // namespace lfm2
