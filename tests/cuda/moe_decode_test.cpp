// The decode MoE block's fused kernels against their CPU twins and unfused GPU counterparts:
// moe_route_decode (logits + top-k + drop + permutation) against cpu::linear + cpu::moe_router +
// cpu::moe_drop_rows and moe_permute_one_block; moe_combine_rmsnorm against moe_combine + rmsnorm
// (bit for bit) and the CPU; moe_decode (the whole block) against the CPU, against its own pieces,
// and replayed from a CUDA graph; and the decode property: a row's bits (residual, next norm) do
// not depend on the other rows of the call or on how many there are. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/linear.h"
#include "kernels/moe_router.h"
#include "kernels/rmsnorm.h"
#include "moe_test_util.h"

namespace lfm2 {
namespace {

using namespace test;

// ----------------------------------------------------------------------------------------- router

// The CPU's routing of rows `in` (rounded to the element type) through gate (n_experts, H).
void cpu_route(std::vector<float>& weights, std::vector<int32_t>& experts, const std::vector<float>& in,
               const std::vector<float>& gate, const std::vector<float>* bias, const std::vector<float>* done,
               int64_t n, int64_t H, int64_t E, int64_t k, bool norm, float scaling) {
  std::vector<float> logits(static_cast<size_t>(n * E));
  cpu::linear(logits.data(), in.data(), gate.data(), n, H, E, 4);
  weights.assign(static_cast<size_t>(n * k), 0.f);
  experts.assign(weights.size(), 0);
  cpu::moe_router(weights.data(), experts.data(), logits.data(), bias ? bias->data() : nullptr, n, E, k, norm,
                  scaling);
  if (done) cpu::moe_drop_rows(experts.data(), done->data(), n, k);
}

struct RouteResult {
  std::vector<float> weights;
  std::vector<int32_t> experts, offsets, src_token, dest_row;
};

template <typename T>
RouteResult route_on_device(const DevBuf<T>& in, const T* gate, const float* bias, const float* done, int64_t n,
                            int64_t H, int64_t E, int64_t k, bool norm, float scaling, cudaStream_t stream,
                            int64_t first_row = 0) {
  const size_t P = static_cast<size_t>(n * k);
  DevBuf<float> w(P);
  DevBuf<int32_t> e(P), off(static_cast<size_t>(E + 1)), src(P), dest(P);
  cuda::moe_route_decode<T>(w.get(), e.get(), off.get(), src.get(), dest.get(), in.get() + first_row * H, gate, bias,
                            done ? done + first_row : nullptr, n, H, E, k, norm, scaling, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return {download(w.get(), P), int_download(e.get(), P), int_download(off.get(), size_t(E + 1)),
          int_download(src.get(), P), int_download(dest.get(), P)};
}

template <typename T>
class CudaMoeRouteDecode : public CudaTest {};
using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaMoeRouteDecode, HalfTypes, ElemNames);

// Experts and weights as the CPU picks them (rows 1..256, 8..256 experts, with and without bias and
// finished rows, several blocks and a partial last one), the permutation as moe_permute_one_block's,
// and each row alone as in the batch, bit for bit; calls of different sizes in a row reuse the
// block counter correctly.
TYPED_TEST(CudaMoeRouteDecode, MatchesCpuAndPermutation) {
  using T = TypeParam;
  for (auto [n, H, E, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 256, 32, 4}, {5, 64, 8, 2},
                            {37, 2048, 32, 4}, {256, 2048, 32, 4}, {23, 256, 48, 3}, {100, 512, 200, 6},
                            {19, 128, 256, 8}}) {
    for (const bool with_bias : {false, true}) {
      auto in = rand_vec(static_cast<size_t>(n * H), 100 + uint64_t(n));
      auto gate = rand_vec(static_cast<size_t>(E * H), 101, float(2.0 / std::sqrt(double(H))));
      const auto bias = rand_vec(static_cast<size_t>(E), 102, 0.05f);
      std::vector<float> done(static_cast<size_t>(n), 0.f);
      for (int64_t t = 1; t < n; t += 5) done[size_t(t)] = 1.f;
      DevBuf<T> d_in(in.size()), d_gate(gate.size());
      upload(d_in, round_to<T>(in));
      upload(d_gate, round_to<T>(gate));
      DevBuf<float> d_bias(bias.size()), d_done(done.size());
      upload(d_bias, bias);
      upload(d_done, done);
      const float* b = with_bias ? d_bias.get() : nullptr;
      std::vector<float> w_ref;
      std::vector<int32_t> e_ref;
      cpu_route(w_ref, e_ref, in, gate, with_bias ? &bias : nullptr, &done, n, H, E, k, true, 2.5f);
      const std::string what = std::to_string(n) + " rows, H " + std::to_string(H) + ", " + std::to_string(E) +
                               " experts, top " + std::to_string(k) + (with_bias ? ", bias" : "");
      const RouteResult got = route_on_device(d_in, d_gate.get(), b, d_done.get(), n, H, E, k, true, 2.5f, this->stream_);
      EXPECT_EQ(got.experts, e_ref) << what;
      EXPECT_TRUE(close(got.weights, w_ref, 1e-5, 1e-4)) << what;
      // the permutation of the same pairs by the one-block kernel
      const size_t P = got.experts.size();
      DevBuf<int32_t> d_e(P), off(static_cast<size_t>(E + 1)), src(P), dest(P);
      upload(d_e, got.experts);
      cuda::moe_permute_one_block(off.get(), src.get(), dest.get(), d_e.get(), n, E, k, this->stream_);
      this->sync();
      EXPECT_EQ(got.offsets, int_download(off.get(), size_t(E + 1))) << what;
      EXPECT_EQ(got.src_token, int_download(src.get(), P)) << what;
      EXPECT_EQ(got.dest_row, int_download(dest.get(), P)) << what;
      // rows alone: the same weights and experts, bit for bit
      for (const int64_t t : {int64_t(0), n / 2, n - 1}) {
        const RouteResult one = route_on_device(d_in, d_gate.get(), b, d_done.get(), 1, H, E, k, true, 2.5f,
                                                this->stream_, t);
        EXPECT_TRUE(same_bits(one.weights, std::vector<float>(got.weights.begin() + t * k,
                                                              got.weights.begin() + (t + 1) * k)))
            << "row " << t << " alone, " << what;
        EXPECT_EQ(one.experts, std::vector<int32_t>(got.experts.begin() + t * k, got.experts.begin() + (t + 1) * k))
            << "row " << t << " alone, " << what;
      }
      const RouteResult again = route_on_device(d_in, d_gate.get(), b, d_done.get(), n, H, E, k, true, 2.5f,
                                                this->stream_);
      EXPECT_EQ(again.src_token, got.src_token) << "second call, " << what;
      EXPECT_EQ(again.offsets, got.offsets) << "second call, " << what;
    }
  }
}

TEST(CudaMoeRouteDecodeRefusal, TooManyExpertsOrUnalignedHidden) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DevBuf<__nv_bfloat16> in(64 * 300), gate(300 * 64);
  DevBuf<float> w(64);
  DevBuf<int32_t> e(64), off(301), src(64), dest(64);
  EXPECT_THROW(cuda::moe_route_decode(w.get(), e.get(), off.get(), src.get(), dest.get(), in.get(), gate.get(), nullptr,
                                      nullptr, 8, 64, 300, 4, true, 1.f, nullptr),
               Error);
  EXPECT_THROW(cuda::moe_route_decode(w.get(), e.get(), off.get(), src.get(), dest.get(), in.get(), gate.get(), nullptr,
                                      nullptr, 8, 60, 32, 4, true, 1.f, nullptr),
               Error);
}

// ------------------------------------------------------------------------------- combine + norm

template <typename T>
class CudaMoeCombineRmsnorm : public CudaTest {};
TYPED_TEST_SUITE(CudaMoeCombineRmsnorm, ElemTypes, ElemNames);

// x += sum_k w y[dest_row] in ascending row order, then out = rmsnorm(x): bit for bit the unfused
// moe_combine + rmsnorm, and the CPU's sums within fp32 tolerance; dropped pairs add nothing; with
// no norm weight only x changes.
TYPED_TEST(CudaMoeCombineRmsnorm, EqualsCombineThenNorm) {
  using T = TypeParam;
  for (auto [n, k, H] : {std::tuple<int64_t, int64_t, int64_t>{1, 4, 2048}, {37, 4, 2048}, {256, 4, 2048},
                         {5, 2, 64}, {3, 8, 8192}, {7, 1, 4}}) {
    const int64_t P = n * k;
    const auto x = rand_vec(static_cast<size_t>(n * H), 120, 3.f);
    const auto y = rand_vec(static_cast<size_t>(P * H), 121);
    const auto tw = rand_vec(static_cast<size_t>(P), 122);
    const auto nw = rand_vec(static_cast<size_t>(H), 123);
    std::vector<int32_t> dest(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) dest[size_t(i)] = int32_t((i * 7919) % P);  // a permutation of the rows
    for (int64_t i = 3; i < P; i += 9) dest[size_t(i)] = -1;                   // dropped pairs
    // CPU: the sum in ascending row order, then the residual add and the norm
    std::vector<float> ref_x = x, ref_out(x.size());
    for (int64_t t = 0; t < n; ++t) {
      std::vector<std::pair<int32_t, float>> pairs;
      for (int64_t j = 0; j < k; ++j) pairs.push_back({dest[size_t(t * k + j)], tw[size_t(t * k + j)]});
      std::sort(pairs.begin(), pairs.end());
      for (int64_t c = 0; c < H; ++c) {
        float acc = 0.f;
        for (const auto& [r, w] : pairs)
          if (r >= 0) acc += y[size_t(r * H + c)] * w;
        ref_x[size_t(t * H + c)] += acc;
      }
    }
    cpu::rmsnorm(ref_out.data(), ref_x.data(), nw.data(), n, H, 1e-5f);
    DevBuf<float> d_x1(x.size()), d_x2(x.size()), d_y(y.size()), d_w(tw.size()), d_nw(nw.size());
    DevBuf<int32_t> d_dest(dest.size());
    DevBuf<T> d_o1(x.size()), d_o2(x.size());
    upload(d_x1, x);
    upload(d_x2, x);
    upload(d_y, y);
    upload(d_w, tw);
    upload(d_nw, nw);
    upload(d_dest, dest);
    cuda::moe_combine_rmsnorm<T>(d_o1.get(), d_x1.get(), d_y.get(), d_dest.get(), d_w.get(), d_nw.get(), n, k, H, 1e-5f,
                                 this->stream_);
    cuda::moe_combine<float>(d_x2.get(), d_y.get(), d_dest.get(), d_w.get(), n, k, H, this->stream_);
    cuda::rmsnorm<T>(d_o2.get(), d_x2.get(), d_nw.get(), n, H, 1e-5f, this->stream_);
    this->sync();
    const std::string what = std::to_string(n) + " rows, top " + std::to_string(k) + ", H " + std::to_string(H);
    const auto got_x = download(d_x1.get(), x.size());
    EXPECT_TRUE(same_bits(got_x, download(d_x2.get(), x.size()))) << what;
    EXPECT_TRUE(same_bits(download(d_o1.get(), x.size()), download(d_o2.get(), x.size()))) << what;
    EXPECT_TRUE(close(got_x, ref_x, 1e-5, 1e-5)) << what;
    EXPECT_TRUE(close_t<T>(download(d_o1.get(), x.size()), ref_out)) << what;
    // no norm: x alone, the same bits
    upload(d_x1, x);
    cuda::moe_combine_rmsnorm<T>(nullptr, d_x1.get(), d_y.get(), d_dest.get(), d_w.get(), nullptr, n, k, H, 1e-5f,
                                 this->stream_);
    this->sync();
    EXPECT_TRUE(same_bits(download(d_x1.get(), x.size()), got_x)) << "no norm, " << what;
  }
}

// ---------------------------------------------------------------------------------- the block

struct BlockCase {
  int64_t n, H, E, I, k;
};

// The router's weights and the next norm's, rounded where the device sees them rounded.
template <typename T>
struct BlockWeights {
  MoeWeights experts;
  std::vector<float> gate, bias, norm;
  DevMoe<T> d_experts;
  DevBuf<T> d_gate;
  DevBuf<float> d_bias, d_norm;
  BlockWeights(const BlockCase& c, uint64_t seed, float bias_scale)
      : experts(moe_weights<T>(c.H, c.E, c.I, seed)),
        gate(rand_vec(static_cast<size_t>(c.E * c.H), seed + 10, float(2.0 / std::sqrt(double(c.H))))),
        bias(rand_vec(static_cast<size_t>(c.E), seed + 11, bias_scale)),
        norm(rand_vec(static_cast<size_t>(c.H), seed + 12)),
        d_experts(experts),
        d_gate(gate.size()),
        d_bias(bias.size()),
        d_norm(norm.size()) {
    upload(d_gate, round_to<T>(gate));
    upload(d_bias, bias);
    upload(d_norm, norm);
  }
};

struct BlockOut {
  std::vector<float> x, norm;
};

// cuda::moe_decode on uploaded copies (done: empty for none); x and the next norm come back.
template <typename T>
BlockOut block_on_device(const BlockWeights<T>& bw, const BlockCase& c, const std::vector<T>& in,
                         const std::vector<float>& x, const std::vector<float>& done, cudaStream_t stream) {
  const cuda::MoeDims dims{c.H, c.E, c.I, c.k, true, 2.5f};
  DevBuf<T> d_in(in.size()), d_out(x.size());
  DevBuf<float> d_x(x.size()), d_done(std::max<size_t>(done.size(), 1));
  DevBuf<char> scratch(static_cast<size_t>(cuda::moe_decode_scratch_bytes(c.n, dims, sizeof(T))));
  upload(d_in, in);
  upload(d_x, x);
  if (!done.empty()) upload(d_done, done);
  cuda::moe_decode<T>(d_x.get(), d_out.get(), d_in.get(), bw.d_gate.get(), bw.d_bias.get(), bw.d_experts.w13.get(),
                      bw.d_experts.w2.get(), done.empty() ? nullptr : d_done.get(), bw.d_norm.get(), 1e-5f, c.n, dims,
                      scratch.get(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return {download(d_x.get(), x.size()), download(d_out.get(), x.size())};
}

template <typename T>
class CudaMoeDecode : public CudaTest {};
TYPED_TEST_SUITE(CudaMoeDecode, ElemTypes, ElemNames);

// The block against the CPU (router, experts, residual add, next norm; finished rows get nothing)
// at rows 1, 5, 32 (the model's shape), 200 (several tokens per expert), one expert favoured by
// the bias (many passes over its weights).
TYPED_TEST(CudaMoeDecode, MatchesCpu) {
  using T = TypeParam;
  for (const auto& [c, bias_scale] : {std::pair<BlockCase, float>{{1, 256, 32, 64, 4}, 0.05f},
                                      {{5, 128, 8, 64, 2}, 0.05f},
                                      {{32, 2048, 32, 1792, 4}, 0.05f},
                                      {{200, 256, 32, 128, 4}, 0.05f},
                                      {{150, 128, 16, 96, 3}, 4.f}}) {
    const BlockWeights<T> bw(c, 130, bias_scale);
    auto in = rand_vec(static_cast<size_t>(c.n * c.H), 140);
    const auto in_raw = round_to<T>(in);
    const auto x = rand_vec(static_cast<size_t>(c.n * c.H), 141, 2.f);
    std::vector<float> done(static_cast<size_t>(c.n), 0.f);
    for (int64_t t = 2; t < c.n; t += 7) done[size_t(t)] = 1.f;
    std::vector<float> w_ref;
    std::vector<int32_t> e_ref;
    cpu_route(w_ref, e_ref, in, bw.gate, &bw.bias, &done, c.n, c.H, c.E, c.k, true, 2.5f);
    const auto x_ref = moe_reference(x, in, bw.experts, e_ref, w_ref, c.n, c.H, c.E, c.I, c.k);
    std::vector<float> norm_ref(x_ref.size());
    cpu::rmsnorm(norm_ref.data(), x_ref.data(), bw.norm.data(), c.n, c.H, 1e-5f);
    const BlockOut got = block_on_device<T>(bw, c, in_raw, x, done, this->stream_);
    const std::string what = std::to_string(c.n) + " rows, H " + std::to_string(c.H) + ", " + std::to_string(c.E) +
                             " experts, I " + std::to_string(c.I) + ", top " + std::to_string(c.k);
    EXPECT_TRUE(close_t<T>(got.x, x_ref, 3)) << what;
    EXPECT_TRUE(close_t<T>(got.norm, norm_ref, 3)) << what;
    for (int64_t t = 2; t < c.n; t += 7)
      EXPECT_TRUE(std::equal(got.x.begin() + t * c.H, got.x.begin() + (t + 1) * c.H, x.begin() + t * c.H))
          << "finished row " << t << ", " << what;
  }
}

// moe_decode equals its pieces (moe_route_decode, moe_experts_decode, rmsnorm) bit for bit, and a
// CUDA graph of it (programmatic launches captured) replays the direct call's bits.
TYPED_TEST(CudaMoeDecode, EqualsPiecesAndGraphReplay) {
  using T = TypeParam;
  if (std::is_same<T, float>::value) GTEST_SKIP() << "fp32 composes the unfused kernels";
  const BlockCase c{64, 512, 32, 448, 4};
  const cuda::MoeDims dims{c.H, c.E, c.I, c.k, true, 2.5f};
  const BlockWeights<T> bw(c, 150, 0.05f);
  auto in = rand_vec(static_cast<size_t>(c.n * c.H), 151);
  const auto in_raw = round_to<T>(in);
  const auto x = rand_vec(static_cast<size_t>(c.n * c.H), 152, 2.f);
  const BlockOut direct = block_on_device<T>(bw, c, in_raw, x, {}, this->stream_);
  // the pieces
  DevBuf<T> d_in(in_raw.size()), d_out(x.size());
  DevBuf<float> d_x(x.size()), d_x0(x.size());
  upload(d_in, in_raw);
  upload(d_x, x);
  upload(d_x0, x);
  const RouteResult r = route_on_device(d_in, bw.d_gate.get(), bw.d_bias.get(), nullptr, c.n, c.H, c.E, c.k, true, 2.5f,
                                        this->stream_);
  DevBuf<float> d_w(r.weights.size());
  DevBuf<int32_t> d_e(r.experts.size());
  upload(d_w, r.weights);
  upload(d_e, r.experts);
  DevBuf<char> s1(static_cast<size_t>(cuda::moe_experts_decode_scratch_bytes(c.n, c.H, c.E, c.I, c.k, sizeof(T))));
  cuda::moe_experts_decode<T>(d_x.get(), d_in.get(), bw.d_experts.w13.get(), bw.d_experts.w2.get(), d_e.get(),
                              d_w.get(), c.n, c.H, c.E, c.I, c.k, s1.get(), this->stream_);
  cuda::rmsnorm<T>(d_out.get(), d_x.get(), bw.d_norm.get(), c.n, c.H, 1e-5f, this->stream_);
  this->sync();
  EXPECT_TRUE(same_bits(download(d_x.get(), x.size()), direct.x)) << "x";
  EXPECT_TRUE(same_bits(download(d_out.get(), x.size()), direct.norm)) << "next norm";
  // a graph: x reset, the block; replayed twice
  DevBuf<char> s2(static_cast<size_t>(cuda::moe_decode_scratch_bytes(c.n, dims, sizeof(T))));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(this->stream_, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemcpyAsync(d_x.get(), d_x0.get(), x.size() * sizeof(float), cudaMemcpyDeviceToDevice, this->stream_));
  cuda::moe_decode<T>(d_x.get(), d_out.get(), d_in.get(), bw.d_gate.get(), bw.d_bias.get(), bw.d_experts.w13.get(),
                      bw.d_experts.w2.get(), nullptr, bw.d_norm.get(), 1e-5f, c.n, dims, s2.get(), this->stream_);
  CUDA_CHECK(cudaStreamEndCapture(this->stream_, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    CUDA_CHECK(cudaGraphLaunch(exec, this->stream_));
    this->sync();
    EXPECT_TRUE(same_bits(download(d_x.get(), x.size()), direct.x)) << "graph replay " << rep;
    EXPECT_TRUE(same_bits(download(d_out.get(), x.size()), direct.norm)) << "graph replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A row's residual and next norm do not depend on the batch: probe rows alone equal the same rows
// inside batches of 7, 32, 200 and 256 rows of other inputs (routed by the router: spread, or
// crowded onto two experts by the bias, some finished), at the first, middle and last place.
TYPED_TEST(CudaMoeDecode, RowsBitIdenticalForAnyBatch) {
  using T = TypeParam;
  const int64_t H = 512, E = 32, I = 448, k = 4, n_probe = 3;
  for (const float crowd : {0.f, 6.f}) {
    BlockCase c{1, H, E, I, k};
    BlockWeights<T> bw(c, 160, 0.05f);
    if (crowd > 0) {  // experts 3 and 7 win every row's first two picks
      std::vector<float> b = bw.bias;
      b[3] += crowd, b[7] += crowd;
      upload(bw.d_bias, b);
    }
    auto probe_in = rand_vec(static_cast<size_t>(n_probe * H), 161);
    const auto probe_raw = round_to<T>(probe_in);
    const auto probe_x = rand_vec(static_cast<size_t>(n_probe * H), 162, 2.f);
    std::vector<BlockOut> alone;
    for (int64_t p = 0; p < n_probe; ++p)
      alone.push_back(block_on_device<T>(bw, c, std::vector<T>(probe_raw.begin() + p * H, probe_raw.begin() + (p + 1) * H),
                                         std::vector<float>(probe_x.begin() + p * H, probe_x.begin() + (p + 1) * H), {},
                                         this->stream_));
    for (const int64_t n : {int64_t(7), int64_t(32), int64_t(200), int64_t(256)}) {
      c.n = n;
      auto in = rand_vec(static_cast<size_t>(n * H), 170 + uint64_t(n));
      auto in_raw = round_to<T>(in);
      auto x = rand_vec(static_cast<size_t>(n * H), 180 + uint64_t(n), 2.f);
      std::vector<float> done(static_cast<size_t>(n), 0.f);
      for (int64_t t = 1; t < n; t += 4) done[size_t(t)] = 1.f;
      const int64_t at[n_probe] = {0, n / 2, n - 1};
      for (int64_t p = 0; p < n_probe; ++p) {
        std::copy_n(probe_raw.begin() + p * H, H, in_raw.begin() + at[p] * H);
        std::copy_n(probe_x.begin() + p * H, H, x.begin() + at[p] * H);
        done[size_t(at[p])] = 0.f;
      }
      const BlockOut got = block_on_device<T>(bw, c, in_raw, x, done, this->stream_);
      for (int64_t p = 0; p < n_probe; ++p) {
        const auto row = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + at[p] * H, v.begin() + (at[p] + 1) * H);
        };
        EXPECT_TRUE(same_bits(row(got.x), alone[size_t(p)].x))
            << "x: probe " << p << " at row " << at[p] << " of " << n << ", crowd " << crowd;
        EXPECT_TRUE(same_bits(row(got.norm), alone[size_t(p)].norm))
            << "next norm: probe " << p << " at row " << at[p] << " of " << n << ", crowd " << crowd;
      }
    }
  }
}

}  // namespace
}  // namespace lfm2
