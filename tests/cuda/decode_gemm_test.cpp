// The decode products against their CPU twins, and their exactness: linear_decode (+ f32out,
// + residual add) against cpu::linear; moe_experts_decode against cpu::moe_experts + cpu::add
// (rows 1, 5, 32, 100, 256, experts with no rows, dropped rows); the one-block permutation against
// the three-launch one; the router with the drop fused against moe_router + moe_drop_rows. Then the
// property the decode step relies on: a row's bits do not depend on the number of rows in the call,
// on the other rows or on their routing (a row alone vs inside batches of 7, 32, 200, ...).
// Inputs are rounded to the element type first; tolerances per dtype. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/add.h"
#include "kernels/cuda/ops.h"
#include "kernels/linear.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_router.h"

namespace lfm2 {
namespace {

using namespace test;

template <typename T>
class CudaDecodeGemm : public CudaTest {};

TYPED_TEST_SUITE(CudaDecodeGemm, ElemTypes, ElemNames);

// ------------------------------------------------------------------------------------------ linear

// The paths a decode product may take (decode_gemm_path): the table's, the kernel, and cuBLASLt's
// picks at 16..256 rows and its pinned large-M algorithm (4096), each forced in turn.
struct ForcedPath {
  bool table;
  cuda::DecodeGemmPath path;
};
std::vector<ForcedPath> all_paths() {
  std::vector<ForcedPath> v{{true, {}}, {false, {cuda::DecodeGemmPath::kKernel, 0}}};
  for (int64_t rows : {16, 32, 64, 128, 256, 4096}) v.push_back({false, {cuda::DecodeGemmPath::kLt, rows}});
  return v;
}
std::string path_name(const ForcedPath& f, int64_t n_in, int64_t n_out) {
  const cuda::DecodeGemmPath p = f.table ? cuda::decode_gemm_path(n_in, n_out) : f.path;
  return std::string(f.table ? "table's " : "") +
         (p.kind == cuda::DecodeGemmPath::kKernel ? "kernel" : "cuBLASLt at " + std::to_string(p.plan_rows) + " rows");
}
// Forces a path for the scope (the table's again at its end).
struct PathScope {
  explicit PathScope(const ForcedPath& f) { cuda::decode_gemm_force_path(f.table ? nullptr : &f.path); }
  ~PathScope() { cuda::decode_gemm_force_path(nullptr); }
};

TYPED_TEST(CudaDecodeGemm, LinearMatchesCpu) {
  using T = TypeParam;
  // (rows, n_in, n_out): split-K shapes (2048 -> 96, 2048 -> 2048), a k tail (136, 200: not
  // multiples of 64), odd n_out, every block layout (1..256 rows) and a chunked call (300 rows)
  // (odd n_out takes the kernel on every path: cuBLASLt wants 16-byte rows)
  for (auto [n, k, m] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 64}, {5, 2048, 96}, {32, 136, 45},
                         {100, 256, 300}, {256, 512, 129}, {7, 2048, 2048}, {64, 200, 33}, {128, 1024, 520},
                         {300, 64, 70}, {17, 7168, 64}}) {
    auto in = rand_vec(static_cast<size_t>(n * k), 5);
    auto w = rand_vec(static_cast<size_t>(m * k), 6, float(1.0 / std::sqrt(double(k))));
    auto x = rand_vec(static_cast<size_t>(n * m), 29, 4.f);
    auto in_raw = round_to<T>(in);
    auto w_raw = round_to<T>(w);
    std::vector<float> ref(static_cast<size_t>(n * m)), ref_add(ref.size());
    cpu::linear(ref.data(), in.data(), w.data(), n, k, m, 4);
    cpu::add(ref_add.data(), x.data(), ref.data(), n * m);
    DevBuf<T> d_in(in.size()), d_w(w.size()), d_out(ref.size());
    DevBuf<float> d_out32(ref.size()), d_x(x.size());
    upload(d_in, in_raw);
    upload(d_w, w_raw);
    for (const ForcedPath& f : {all_paths()[0], all_paths()[1], all_paths()[3]}) {
      const PathScope scope(f);
      upload(d_x, x);
      cuda::linear_decode(d_out.get(), d_in.get(), d_w.get(), n, k, m, this->stream_);
      cuda::linear_f32out_decode(d_out32.get(), d_in.get(), d_w.get(), n, k, m, this->stream_);
      cuda::linear_add_f32_decode(d_x.get(), d_in.get(), d_w.get(), n, k, m, this->stream_);
      this->sync();
      const std::string what = std::to_string(n) + "x" + std::to_string(k) + "x" + std::to_string(m) + ", " +
                               path_name(f, k, m);
      EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), ref)) << what;
      EXPECT_TRUE(close(download(d_out32.get(), ref.size()), ref, 1e-5, 1e-4)) << what;
      EXPECT_TRUE(close(download(d_x.get(), x.size()), ref_add, 1e-5, 1e-4)) << "add " << what;
    }
  }
}

// Every row of a call of 1..256 rows (and of a chunked 300) equals the same row computed in a call of
// 256 rows, bit for bit, whatever rows surround it, on every path: the model's projection shapes
// (split-K ones included for the kernel), each with the products the model uses for it (all three
// for 2048 -> 2048).
TYPED_TEST(CudaDecodeGemm, LinearRowsBitIdenticalForAnyRowCount) {
  using T = TypeParam;
  // (n_in, n_out, products: bit 0 T out, bit 1 fp32 out, bit 2 += fp32)
  for (auto [k, m, prods] : {std::tuple<int64_t, int64_t, int>{2048, 2048, 7}, {2048, 3072, 1}, {2048, 6144, 1},
                             {7168, 2048, 4}, {2048, 32, 2}, {2048, 14336, 1}, {2048, 65536, 2}}) {
    const int64_t big = 256, extra = 300;
    auto in = rand_vec(static_cast<size_t>(extra * k), 30);
    auto w = rand_vec(static_cast<size_t>(m * k), 31, float(1.0 / std::sqrt(double(k))));
    DevBuf<T> d_in(in.size()), d_w(w.size()), d_out(static_cast<size_t>(extra * m));
    DevBuf<float> d_out32(static_cast<size_t>(extra * m));
    upload(d_in, round_to<T>(in));
    upload(d_w, round_to<T>(w));
    for (const ForcedPath& f : all_paths()) {
      if (std::is_same<T, float>::value && !f.table) continue;  // fp32 always runs `linear`
      const PathScope scope(f);
      const std::string what = std::to_string(k) + " -> " + std::to_string(m) + ", " + path_name(f, k, m);
      // product 0: T out, 1: fp32 out, 2: += into a zeroed fp32 x (the add's own algorithm)
      for (int prod = 0; prod < 3; ++prod) {
        if (!((prods >> prod) & 1)) continue;
        auto run = [&](int64_t r0, int64_t rows) {
          if (prod == 0) {
            cuda::linear_decode(d_out.get(), d_in.get() + r0 * k, d_w.get(), rows, k, m, this->stream_);
            this->sync();
            return download(d_out.get(), static_cast<size_t>(rows * m));
          }
          if (prod == 2)
            CUDA_CHECK(cudaMemsetAsync(d_out32.get(), 0, size_t(rows * m) * sizeof(float), this->stream_));
          if (prod == 1)
            cuda::linear_f32out_decode(d_out32.get(), d_in.get() + r0 * k, d_w.get(), rows, k, m, this->stream_);
          else
            cuda::linear_add_f32_decode(d_out32.get(), d_in.get() + r0 * k, d_w.get(), rows, k, m, this->stream_);
          this->sync();
          return download(d_out32.get(), static_cast<size_t>(rows * m));
        };
        const auto all = run(0, big);
        // (first row, rows): a row alone at several places, small and large batches, every block layout
        for (auto [r0, rows] : {std::pair<int64_t, int64_t>{0, 1}, {100, 1}, {255, 1}, {3, 7}, {40, 32}, {9, 13},
                                {50, 64}, {1, 100}, {20, 200}, {0, 255}}) {
          EXPECT_TRUE(same_bits(run(r0, rows), std::vector<float>(all.begin() + r0 * m, all.begin() + (r0 + rows) * m)))
              << "product " << prod << ": " << rows << " rows from " << r0 << ", " << what;
        }
        // more than 256 rows (the kernel runs them in chunks): the first 256 rows equal the 256-row call
        const auto longer = run(0, extra);
        EXPECT_TRUE(same_bits(std::vector<float>(longer.begin(), longer.begin() + big * m), all))
            << "product " << prod << ": 300 rows, " << what;
      }
    }
  }
}

TEST(CudaDecodeGemmRefusal, UnalignedInputsAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DevBuf<__nv_bfloat16> d_in(64 * 40), d_w(64 * 40), d_out(64 * 64);
  EXPECT_THROW(cuda::linear_decode(d_out.get(), d_in.get(), d_w.get(), 4, 36, 64, nullptr), Error);
  EXPECT_THROW(cuda::linear_decode(d_out.get(), d_in.get() + 1, d_w.get(), 4, 32, 64, nullptr), Error);
}

// ------------------------------------------------------------------------------------------- MoE

// Forces a variant of the expert products for the scope (2-8 share their bits; 9-15, wgmma on
// sm_90, share theirs (elsewhere they run 2's bits); 1 has its own).
struct VariantScope {
  explicit VariantScope(int v) { cuda::moe_experts_decode_force_variant(v); }
  ~VariantScope() { cuda::moe_experts_decode_force_variant(0); }
};

// cuda::moe_experts_decode on uploaded copies; x comes back. The scratch starts as `fill` bytes.
template <typename T>
std::vector<float> moe_decode_on_device(const DevMoe<T>& dw, const std::vector<float>& x, const std::vector<T>& in,
                                        const std::vector<int32_t>& experts, const std::vector<float>& weights,
                                        int64_t n, int64_t H, int64_t E, int64_t I, int64_t k, cudaStream_t stream,
                                        int fill = 0) {
  DevBuf<T> d_in(in.size());
  DevBuf<float> d_x(x.size()), d_w(weights.size());
  DevBuf<int32_t> d_e(experts.size());
  const size_t scratch = static_cast<size_t>(cuda::moe_experts_decode_scratch_bytes(n, H, E, I, k, sizeof(T)));
  DevBuf<char> d_scratch(scratch);
  CUDA_CHECK(cudaMemset(d_scratch.get(), fill, scratch));
  upload(d_in, in);
  upload(d_x, x);
  upload(d_w, weights);
  upload(d_e, experts);
  cuda::moe_experts_decode(d_x.get(), d_in.get(), dw.w13.get(), dw.w2.get(), d_e.get(), d_w.get(), n, H, E, I, k,
                           d_scratch.get(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return download(d_x.get(), x.size());
}

TYPED_TEST(CudaDecodeGemm, MoeExpertsDecodeMatchesCpu) {
  using T = TypeParam;
  struct Case {
    int64_t n, H, E, I, k;
    Routing routing;
  };
  // rows 1, 5, 32, 100, 256; odd H / I (not multiples of 64; of 16 for the row tiles: 40, 24);
  // experts with no rows (few, one, and 1 or 5 tokens over 32 experts); one expert holding every
  // token (several passes over its weights); the model's shape at 32 rows. Every variant of the
  // products (1: the first kernels; 2-8: the pipelined ones, the same bits for any stages, grid, L2
  // hints, or blocks taking (unit, pass) items; 9-15: the pipelined ones on wgmma, the same bits
  // for 6 or 4 stages, units or items from a counter, or both products in one grid: 13-15, where
  // the cases with few experts touched start most blocks on down units that wait for gate/up's).
  for (const Case c : {Case{1, 256, 32, 64, 4, Routing::kSpread}, Case{5, 64, 4, 40, 4, Routing::kSpread},
                       Case{32, 128, 32, 96, 4, Routing::kRandom}, Case{100, 64, 8, 48, 2, Routing::kRandom},
                       Case{256, 128, 32, 72, 4, Routing::kRandom}, Case{37, 40, 7, 24, 1, Routing::kSpread},
                       Case{150, 64, 33, 32, 2, Routing::kFew}, Case{257, 128, 9, 64, 3, Routing::kOne},
                       Case{5, 128, 32, 64, 4, Routing::kRandom}, Case{32, 2048, 32, 1792, 4, Routing::kRandom}}) {
    const auto [n, H, E, I, k, routing] = c;
    const MoeWeights w = moe_weights<T>(H, E, I, 18);
    const DevMoe<T> dw(w);
    auto in = rand_vec(static_cast<size_t>(n * H), 17);
    auto in_raw = round_to<T>(in);
    const auto x = rand_vec(static_cast<size_t>(n * H), 21);
    std::vector<int32_t> experts;
    std::vector<float> weights;
    make_routing(experts, weights, n, E, k, routing, 3);
    const auto ref = moe_reference(x, in, w, experts, weights, n, H, E, I, k);
    std::vector<float> pipelined, wgmma;
    for (const int variant : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}) {
      const VariantScope scope(variant);
      const auto got = moe_decode_on_device<T>(dw, x, in_raw, experts, weights, n, H, E, I, k, this->stream_);
      // bf16/fp16 round the activation once (gate/up and the expert outputs stay fp32); x3 as moe_experts
      EXPECT_TRUE(close_t<T>(got, ref, 3)) << n << " tokens, H " << H << ", " << E << " experts, I " << I
                                           << ", top " << k << ", routing " << int(routing) << ", variant "
                                           << variant;
      if (variant == 2) pipelined = got;
      if (variant > 2 && variant <= 8) {
        EXPECT_TRUE(same_bits(got, pipelined)) << "variant " << variant << " vs 2, " << n << " tokens";
      }
      if (variant == 9) wgmma = got;
      if (variant >= 10) {
        EXPECT_TRUE(same_bits(got, wgmma)) << "variant " << variant << " vs 9, " << n << " tokens";
      }
    }
    // 11 with gate/up's first unit fetched into L2 by none, part or all of each row: the same bits
    for (const int spec : {0, 512, 1 << 20}) {
      const VariantScope scope(11);
      cuda::moe_experts_decode_force_spec_bytes(spec);
      const auto got = moe_decode_on_device<T>(dw, x, in_raw, experts, weights, n, H, E, I, k, this->stream_);
      cuda::moe_experts_decode_force_spec_bytes(-1);
      EXPECT_TRUE(same_bits(got, wgmma)) << "variant 11, " << spec << " bytes a row fetched, " << n << " tokens";
    }
  }
}

// Finished rows (expert -1 in every slot) keep their residual row; the others match the CPU; also
// when every row of the call has finished. The scratch holds stale indices.
TYPED_TEST(CudaDecodeGemm, MoeExpertsDecodeDroppedRows) {
  using T = TypeParam;
  const int64_t H = 128, E = 32, I = 64, k = 4;
  const MoeWeights w = moe_weights<T>(H, E, I, 52);
  const DevMoe<T> dw(w);
  for (const int64_t n : {int64_t(37), int64_t(3), int64_t(256)}) {
    auto in = rand_vec(static_cast<size_t>(n * H), 51);
    auto in_raw = round_to<T>(in);
    const auto x = rand_vec(static_cast<size_t>(n * H), 54);
    std::vector<int32_t> experts;
    std::vector<float> weights;
    make_routing(experts, weights, n, E, k, Routing::kRandom, 5);
    for (int64_t t = 0; t < n; ++t)
      if (n == 3 || t % 3 == 1) std::fill_n(experts.begin() + t * k, k, -1);  // n = 3: all finished
    const auto ref = moe_reference(x, in, w, experts, weights, n, H, E, I, k);
    for (const int variant : {0, 1, 9, 10, 11, 12, 13, 14, 15}) {
      const VariantScope scope(variant);
      const auto got = moe_decode_on_device<T>(dw, x, in_raw, experts, weights, n, H, E, I, k, this->stream_, 0x7f);
      EXPECT_TRUE(close_t<T>(got, ref, 3)) << n << " tokens, variant " << variant;
      for (int64_t t = 0; t < n; ++t) {
        if (experts[size_t(t * k)] >= 0) continue;
        EXPECT_TRUE(std::equal(got.begin() + t * H, got.begin() + (t + 1) * H, x.begin() + t * H))
            << "row " << t << ", variant " << variant;
      }
    }
  }
}

// A row's bits do not depend on the batch: probe rows computed alone equal the same rows inside
// batches of 7, 32 and 200 rows whose other rows (inputs, residuals, routings: random, or all on
// one expert, or finished) differ, at the probes' positions 0, middle and last.
TYPED_TEST(CudaDecodeGemm, MoeExpertsDecodeRowsBitIdenticalForAnyBatch) {
  using T = TypeParam;
  const int64_t H = 512, E = 32, I = 448, k = 4;
  const MoeWeights w = moe_weights<T>(H, E, I, 60);
  const DevMoe<T> dw(w);
  for (const int variant : {0, 1, 8, 9, 10, 11, 12, 13, 14, 15}) {
    const VariantScope scope(variant);
    const int64_t n_probe = 3;
    auto probe_in = rand_vec(static_cast<size_t>(n_probe * H), 61);
    auto probe_raw = round_to<T>(probe_in);
    const auto probe_x = rand_vec(static_cast<size_t>(n_probe * H), 62);
    std::vector<int32_t> probe_e;
    std::vector<float> probe_w;
    make_routing(probe_e, probe_w, n_probe, E, k, Routing::kRandom, 63);
    std::vector<std::vector<float>> alone(n_probe);
    for (int64_t p = 0; p < n_probe; ++p)
      alone[p] = moe_decode_on_device<T>(
          dw, std::vector<float>(probe_x.begin() + p * H, probe_x.begin() + (p + 1) * H),
          std::vector<T>(probe_raw.begin() + p * H, probe_raw.begin() + (p + 1) * H),
          std::vector<int32_t>(probe_e.begin() + p * k, probe_e.begin() + (p + 1) * k),
          std::vector<float>(probe_w.begin() + p * k, probe_w.begin() + (p + 1) * k), 1, H, E, I, k, this->stream_);
    for (const int64_t n : {int64_t(7), int64_t(32), int64_t(200)}) {
      for (const Routing others : {Routing::kRandom, Routing::kOne, Routing::kFew}) {
        auto in = rand_vec(static_cast<size_t>(n * H), 70 + uint64_t(n));
        auto in_raw = round_to<T>(in);
        auto x = rand_vec(static_cast<size_t>(n * H), 80 + uint64_t(n));
        std::vector<int32_t> experts;
        std::vector<float> weights;
        make_routing(experts, weights, n, E, k, others, 90 + uint64_t(n));
        if (others == Routing::kFew)  // and some finished rows
          for (int64_t t = 1; t < n; t += 4) std::fill_n(experts.begin() + t * k, k, -1);
        const int64_t at[n_probe] = {0, n / 2, n - 1};
        for (int64_t p = 0; p < n_probe; ++p) {
          std::copy_n(probe_raw.begin() + p * H, H, in_raw.begin() + at[p] * H);
          std::copy_n(probe_x.begin() + p * H, H, x.begin() + at[p] * H);
          std::copy_n(probe_e.begin() + p * k, k, experts.begin() + at[p] * k);
          std::copy_n(probe_w.begin() + p * k, k, weights.begin() + at[p] * k);
        }
        const auto got = moe_decode_on_device<T>(dw, x, in_raw, experts, weights, n, H, E, I, k, this->stream_);
        for (int64_t p = 0; p < n_probe; ++p)
          EXPECT_TRUE(same_bits(std::vector<float>(got.begin() + at[p] * H, got.begin() + (at[p] + 1) * H), alone[p]))
              << "probe " << p << " at row " << at[p] << " of " << n << ", others routed " << int(others)
              << ", variant " << variant;
      }
    }
  }
}

// ------------------------------------------------------------------------- permutation and router

class CudaDecodeRouting : public CudaTest {};

TEST_F(CudaDecodeRouting, PermuteOneBlockEqualsPermute) {
  for (auto [n, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 4}, {37, 32, 4}, {256, 32, 4}, {100, 7, 2},
                         {700, 33, 3}, {3000, 128, 2}, {64, 1024, 8}, {5, 4, 4}}) {
    std::vector<int32_t> experts;
    std::vector<float> weights;
    make_routing(experts, weights, n, E, k, Routing::kRandom, 11 + uint64_t(n));
    for (int64_t t = 2; t < n; t += 5) std::fill_n(experts.begin() + t * k, k, -1);
    const size_t P = experts.size();
    DevBuf<int32_t> d_e(P), o1(size_t(E + 1)), s1(P), r1(P), o2(size_t(E + 1)), s2(P), r2(P),
        scr(static_cast<size_t>(cuda::moe_permute_scratch_ints(n, E, k)));
    upload(d_e, experts);
    cuda::moe_permute(o1.get(), s1.get(), r1.get(), d_e.get(), n, E, k, scr.get(), stream_);
    cuda::moe_permute_one_block(o2.get(), s2.get(), r2.get(), d_e.get(), n, E, k, stream_);
    sync();
    EXPECT_EQ(int_download(o2.get(), size_t(E + 1)), int_download(o1.get(), size_t(E + 1))) << n << " x " << k;
    EXPECT_EQ(int_download(s2.get(), P), int_download(s1.get(), P)) << n << " x " << k;
    EXPECT_EQ(int_download(r2.get(), P), int_download(r1.get(), P)) << n << " x " << k;
  }
}

TEST_F(CudaDecodeRouting, RouterDropEqualsRouterThenDrop) {
  for (auto [n, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 4}, {33, 32, 4}, {256, 32, 4}, {50, 64, 6}}) {
    const auto logits = rand_vec(static_cast<size_t>(n * E), 40, 4.f);
    const auto bias = rand_vec(static_cast<size_t>(E), 41, 0.1f);
    std::vector<float> done(static_cast<size_t>(n), 0.f);
    for (int64_t t = 0; t < n; t += 3) done[size_t(t)] = 1.f;
    std::vector<float> w(static_cast<size_t>(n * k));
    std::vector<int32_t> ids(w.size());
    cpu::moe_router(w.data(), ids.data(), logits.data(), bias.data(), n, E, k, true, 2.5f);
    cpu::moe_drop_rows(ids.data(), done.data(), n, k);
    DevBuf<float> d_l(logits.size()), d_b(bias.size()), d_done(done.size()), d_w1(w.size()), d_w2(w.size());
    DevBuf<int32_t> d_i1(w.size()), d_i2(w.size());
    upload(d_l, logits);
    upload(d_b, bias);
    upload(d_done, done);
    cuda::moe_router(d_w1.get(), d_i1.get(), d_l.get(), d_b.get(), n, E, k, true, 2.5f, stream_);
    cuda::moe_drop_rows(d_i1.get(), d_done.get(), n, k, stream_);
    cuda::moe_router_drop(d_w2.get(), d_i2.get(), d_l.get(), d_b.get(), d_done.get(), n, E, k, true, 2.5f, stream_);
    sync();
    EXPECT_EQ(int_download(d_i2.get(), w.size()), ids) << n;
    EXPECT_EQ(int_download(d_i2.get(), w.size()), int_download(d_i1.get(), w.size())) << n;
    EXPECT_TRUE(same_bits(download(d_w2.get(), w.size()), download(d_w1.get(), w.size()))) << n;
    EXPECT_TRUE(close(download(d_w2.get(), w.size()), w, 1e-6, 1e-5)) << n;
  }
}

}  // namespace
}  // namespace lfm2
