// The FP8 grouped GEMM for prefill (kernels/cuda/grouped_gemm_fp8.h) against its CPU twins
// (kernels/moe_grouped_fp8.h), and the whole prompt-row MoE on it (moe_experts_fp8) against the
// model's CPU oracle with FP8 activations (cpu::moe_experts with fp8_act_group: the weights
// dequantized, each product's input fake-quantized). Oracles and tolerances:
// - quantization of gathered bf16 / fp16 rows, per row and per (row, 128 columns): bits and
//   scales equal to cpu::moe_quantize_e4m3's (a zero group and a saturating value included; rows of
//   2,048 and 4,608 columns; every bf16 ratio of a value to its group's amax); the byte gather of
//   rows quantized before (moe_gather_e4m3): the same;
// - the SwiGLU's quantization: cpu::moe_swiglu_quantize_e4m3 (padding rows too); scales within 1e-6
//   relative, codes at most one apart and 99 % equal (the device's silu is the fast exponential and
//   division), a row whose groups' amax is below 2^-100 (codes by v / s) included;
// - the products, channel and block128 weight scales, per-row and per-128 activation scales:
//   cpu::moe_grouped_matmul_fp8 at bf16's tolerance (bf16 out);
// - the channel scheme's raw products (moe_grouped_matmul_fp8_raw, no scales): the fp32 sums of the
//   codes (cpu::moe_grouped_matmul_fp8_raw) at bf16's tolerance, atol scaled by the sums' rms;
// - the scaled SwiGLU's quantization and the scaled combine that apply the channel scales:
//   their CPU twins, as the unscaled SwiGLU's (codes) and within 1e-6 norm-relative (the combine);
// - moe_experts_fp8: the oracle within 2 % norm-relative error (the GPU rounds gate/up and the
//   expert outputs to bf16 before quantizing or combining), and row 0 alone bit-equal to its batch;
//   the channel scheme on the plain kernel (the default) and on the blockwise one;
// - the blockwise kernel's block128 configurations and tile schedules: the default's bits;
// - moe_pad_rows: cpu::moe_pad_rows' rows, tiles, pairs and rows in use;
// - the padded product (rows padded per expert, one GEMM): the grouped kernel's bits, the tiles past
//   the rows in use not written; gate/up with the SwiGLU in its epilogue: the padded product and
//   moe_swiglu_quantize_e4m3's codes and scales; and moe_experts_fp8 on it (block128's default, the
//   SwiGLU fused and not) the grouped path's bits.
// Ragged groups with an empty expert, the model's widths. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "common/fp8.h"
#include "cuda_test_util.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/ops.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_grouped_fp8.h"
#include "moe_test_util.h"

namespace lfm2 {
namespace {

using namespace test;

// Expert e's weights (n_out, n_in) quantized under scheme; the scales as the GPU kernel reads them,
// k-block major per expert (channel: each row's repeated, (n_in / 128, n_out); block128:
// transposed to (n_in / 128, n_out / 128)).
struct Experts {
  std::vector<uint8_t> q;
  std::vector<float> s;
};

Experts make_experts(int64_t E, int64_t n_out, int64_t n_in, Fp8Scheme scheme, uint64_t seed) {
  const auto w = rand_vec(size_t(E * n_out * n_in), seed, 0.05f);
  const int64_t NB = n_out / 128, KB = n_in / 128;
  const bool channel = scheme == Fp8Scheme::Channel;
  const int64_t per = channel ? n_out : NB * KB;
  Experts x{std::vector<uint8_t>(w.size()), std::vector<float>(size_t(E * KB * (channel ? n_out : NB)))};
  std::vector<float> s(static_cast<size_t>(per));
  for (int64_t e = 0; e < E; ++e) {
    fp8_quantize(x.q.data() + e * n_out * n_in, s.data(), w.data() + e * n_out * n_in, n_out, n_in, scheme);
    for (int64_t kb = 0; kb < KB; ++kb)
      for (int64_t n = 0; n < (channel ? n_out : NB); ++n)  // (kb, n) <- channel (n); block128 (nb, kb)
        x.s[size_t((e * KB + kb) * (channel ? n_out : NB) + n)] = s[size_t(channel ? n : n * KB + kb)];
  }
  return x;
}

::testing::AssertionResult norm_close(const std::vector<float>& got, const std::vector<float>& ref, double bound) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "element " << i << " is " << got[i];
    d2 += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    r2 += double(ref[i]) * ref[i];
  }
  const double rel = std::sqrt(d2 / std::max(r2, 1e-30));
  if (rel <= bound) return ::testing::AssertionSuccess() << "norm-relative error " << rel;
  return ::testing::AssertionFailure() << "norm-relative error " << rel << " > " << bound;
}

template <typename T>
class CudaFp8Grouped : public CudaTest {};
using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaFp8Grouped, HalfTypes, ElemNames);

TYPED_TEST(CudaFp8Grouped, QuantizeMatchesCpu) {
  using T = TypeParam;
  const std::vector<int32_t> offsets = {0, 70, 70, 181, 250, 300};  // expert 1 empty
  const int64_t E = int64_t(offsets.size()) - 1, rows = offsets.back(), cols = 384, n_src = rows;
  auto x = rand_vec(size_t(n_src * cols), 5, 3.f);
  std::fill(x.begin() + 75 * cols + 128, x.begin() + 75 * cols + 256, 0.f);  // a zero group: scale 1
  x[size_t(9 * cols + 3)] = 1e4f;                                             // a large one: 448 exactly
  std::vector<int32_t> src(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) src[size_t(r)] = int32_t((r * 37 + 11) % 120);  // the gather, repeats too
  src[5] = src[200] = -1;  // padding rows (moe_pad_rows): zero codes, scales 1
  const auto raw = round_to<T>(x);
  DevBuf<T> d_x(raw.size());
  DevBuf<int32_t> d_off(offsets.size()), d_src(src.size());
  DevBuf<uint8_t> d_q(size_t(rows * cols));
  DevBuf<float> d_s(size_t(rows * cols / 128));
  upload(d_x, raw);
  upload(d_off, offsets);
  upload(d_src, src);
  // the tokens quantized before (rmsnorm_quantize_e4m3's layout: one group of n_tok rows), for the byte gather
  const int64_t n_tok = 120;
  const std::vector<int32_t> tok_offsets = {0, int32_t(n_tok)};
  DevBuf<int32_t> d_tok_off(2);
  DevBuf<uint8_t> d_tok_q(size_t(n_tok * cols));
  DevBuf<float> d_tok_s(size_t(n_tok * cols / 128));
  upload(d_tok_off, tok_offsets);
  for (const bool per_row : {false, true})
    for (const bool gather : {false, true}) {
      SCOPED_TRACE(cat(per_row ? "per row" : "per 128 columns", gather ? ", gathered" : ""));
      const int64_t n_s = cuda::moe_e4m3_scale_count(rows, cols);
      cuda::moe_quantize_e4m3(d_q.get(), d_s.get(), d_x.get(), gather ? d_src.get() : nullptr, d_off.get(), rows, E,
                              cols, per_row, this->stream_);
      this->sync();
      std::vector<uint8_t> q(size_t(rows * cols));
      std::vector<float> s(static_cast<size_t>(n_s));
      cpu::moe_quantize_e4m3(q.data(), s.data(), x.data(), gather ? src.data() : nullptr, offsets.data(), rows, E,
                             cols, per_row);
      EXPECT_EQ(byte_download(d_q.get(), q.size()), q);
      EXPECT_EQ(download(d_s.get(), s.size()), s);
      if (!gather) continue;
      // the byte gather of the quantized tokens: moe_quantize_e4m3's bits
      CUDA_CHECK(cudaMemset(d_q.get(), 0xff, q.size()));
      CUDA_CHECK(cudaMemset(d_s.get(), 0xff, s.size() * 4));
      cuda::moe_quantize_e4m3(d_tok_q.get(), d_tok_s.get(), d_x.get(), nullptr, d_tok_off.get(), n_tok, 1, cols,
                              per_row, this->stream_);
      cuda::moe_gather_e4m3(d_q.get(), d_s.get(), d_tok_q.get(), d_tok_s.get(), n_tok, d_src.get(), d_off.get(), rows,
                            E, cols, this->stream_);
      this->sync();
      EXPECT_EQ(byte_download(d_q.get(), q.size()), q) << "byte gather";
      EXPECT_EQ(download(d_s.get(), s.size()), s) << "byte gather";
    }
}

// Rows at the model's hidden (2,048 columns) and wider (4,608): bits and scales equal to the CPU
// twin's.
TEST_F(CudaTest, Fp8QuantizeWideRowsMatchesCpu) {
  const std::vector<int32_t> offsets = {0, 3, 3, 40};
  const int64_t E = 3, rows = 40;
  for (const int64_t cols : {int64_t(2048), int64_t(4608)})
    for (const bool per_row : {false, true}) {
      SCOPED_TRACE(cat(cols, " columns, ", per_row ? "per row" : "per 128 columns"));
      auto x = rand_vec(size_t(rows * cols), 15, 2.f);
      x[size_t(7 * cols + cols - 5)] = 300.f;  // the row's amax in its last step
      const auto raw = round_to<__nv_bfloat16>(x);
      DevBuf<__nv_bfloat16> d_x(raw.size());
      DevBuf<int32_t> d_off(offsets.size());
      DevBuf<uint8_t> d_q(size_t(rows * cols));
      DevBuf<float> d_s(size_t(rows * cols / 128));
      upload(d_x, raw);
      upload(d_off, offsets);
      cuda::moe_quantize_e4m3(d_q.get(), d_s.get(), d_x.get(), nullptr, d_off.get(), rows, E, cols, per_row,
                              this->stream_);
      this->sync();
      std::vector<uint8_t> q(size_t(rows * cols));
      std::vector<float> s(size_t(rows * cols / 128));
      cpu::moe_quantize_e4m3(q.data(), s.data(), x.data(), nullptr, offsets.data(), rows, E, cols, per_row);
      EXPECT_EQ(byte_download(d_q.get(), q.size()), q);
      EXPECT_EQ(download(d_s.get(), s.size()), s);
    }
}

// Codes at most one apart and 99 % equal, scales within 1e-6 relative (the device's expf is not
// glibc's).
void expect_codes_close(const std::vector<uint8_t>& gq, const std::vector<uint8_t>& q, const std::vector<float>& gs,
                        const std::vector<float>& s) {
  int64_t same = 0, far = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    same += gq[i] == q[i];
    far += std::abs(int(gq[i] & 0x7f) - int(q[i] & 0x7f)) > 1 || ((gq[i] ^ q[i]) & 0x80 && (q[i] & 0x7f));
  }
  EXPECT_EQ(far, 0) << "codes more than one apart";
  EXPECT_GE(double(same), 0.99 * double(q.size()));
  for (size_t i = 0; i < s.size(); ++i) ASSERT_NEAR(gs[i], s[i], 1e-6 * s[i]) << "scale " << i;
}

TEST_F(CudaTest, Fp8SwigluQuantizeMatchesCpu) {
  const std::vector<int32_t> offsets = {0, 40, 40, 300};
  const int64_t E = 3, rows = 300, inter = 384;
  auto gu = rand_vec(size_t(rows * 2 * inter), 9, 4.f);
  // row 7: a SwiGLU of subnormals, some exactly 0 (amax < 2^-100: codes by v / s, not 448 / amax)
  for (int64_t c = 0; c < 2 * inter; ++c) {
    float& v = gu[size_t(7 * 2 * inter + c)];
    v = c % 5 == 0 ? 0.f : v * 1e-20f;
  }
  // padding rows (moe_pad_rows' -1) 3, 45, 299: zero codes, their NaN gate_up not read
  std::vector<int32_t> pad(static_cast<size_t>(rows));
  std::iota(pad.begin(), pad.end(), 0);
  for (const int64_t r : {3, 45, 299}) {
    pad[size_t(r)] = -1;
    std::fill_n(gu.begin() + r * 2 * inter, 2 * inter, std::numeric_limits<float>::quiet_NaN());
  }
  const auto raw = round_to<__nv_bfloat16>(gu);
  DevBuf<__nv_bfloat16> d_gu(raw.size());
  DevBuf<int32_t> d_off(offsets.size()), d_pad(pad.size());
  DevBuf<uint8_t> d_q(size_t(rows * inter));
  DevBuf<float> d_s(size_t(rows * inter / 128));
  upload(d_gu, raw);
  upload(d_off, offsets);
  upload(d_pad, pad);
  for (const bool per_row : {false, true}) {
    SCOPED_TRACE(per_row ? "per row" : "per 128 columns");
    const int64_t n_s = cuda::moe_e4m3_scale_count(rows, inter);
    cuda::moe_swiglu_quantize_e4m3(d_q.get(), d_s.get(), d_gu.get(), d_pad.get(), d_off.get(), rows, E, inter,
                                   per_row, this->stream_);
    this->sync();
    std::vector<uint8_t> q(size_t(rows * inter));
    std::vector<float> s(static_cast<size_t>(n_s));
    cpu::moe_swiglu_quantize_e4m3(q.data(), s.data(), gu.data(), pad.data(), offsets.data(), rows, E, inter, per_row);
    const auto gq = byte_download(d_q.get(), q.size());
    expect_codes_close(gq, q, download(d_s.get(), s.size()), s);
    EXPECT_EQ(std::count_if(gq.begin(), gq.end(), e4m3_is_nan), 0) << "NaN codes (row 7: a factor of inf)";
    EXPECT_TRUE(std::all_of(gq.begin() + 45 * inter, gq.begin() + 46 * inter, [](uint8_t v) { return v == 0; }))
        << "padding row 45's codes";
  }
}

// The SwiGLU of raw gate/up sums with the channel scales applied first (per-row activation scales
// over n_in = 256 columns, per-output-row weight scales of w13), at the model's inter too and past
// the 2,048 columns the kernel keeps in registers (2,304: the rest read again).
TEST_F(CudaTest, Fp8SwigluQuantizeScaledMatchesCpu) {
  for (const int64_t inter : {int64_t(384), int64_t(1792), int64_t(2304)}) {
    SCOPED_TRACE(cat("inter ", inter));
    const std::vector<int32_t> offsets = {0, 40, 40, 300};
    const int64_t E = 3, rows = 300, n_in = 256, G = n_in / 128;
    auto gu = rand_vec(size_t(rows * 2 * inter), 19, 3e3f);  // raw sums of e4m3 codes
    const auto raw = round_to<__nv_bfloat16>(gu);
    auto sa = rand_vec(size_t(rows * G), 20, 1e-3f);
    auto sw = rand_vec(size_t(E * G * 2 * inter), 21, 1e-3f);
    for (float& v : sa) v = std::fabs(v) + 1e-4f;
    for (float& v : sw) v = std::fabs(v) + 1e-4f;
    DevBuf<__nv_bfloat16> d_gu(raw.size());
    DevBuf<int32_t> d_off(offsets.size());
    DevBuf<float> d_sa(sa.size()), d_sw(sw.size()), d_s(size_t(rows * inter / 128));
    DevBuf<uint8_t> d_q(size_t(rows * inter));
    upload(d_gu, raw);
    upload(d_off, offsets);
    upload(d_sa, sa);
    upload(d_sw, sw);
    cuda::moe_swiglu_quantize_e4m3_scaled(d_q.get(), d_s.get(), d_gu.get(), d_sa.get(), d_sw.get(), d_off.get(), rows,
                                          E, n_in, inter, this->stream_);
    this->sync();
    std::vector<uint8_t> q(size_t(rows * inter));
    std::vector<float> s(size_t(rows * inter / 128));
    cpu::moe_swiglu_quantize_e4m3_scaled(q.data(), s.data(), gu.data(), sa.data(), sw.data(), offsets.data(), rows, E,
                                         n_in, inter);
    expect_codes_close(byte_download(d_q.get(), q.size()), q, download(d_s.get(), s.size()), s);
  }
}

// The combine of raw down sums with the channel scales: ragged experts (one empty), dropped pairs,
// the model's hidden and top-4.
TEST_F(CudaTest, Fp8CombineScaledMatchesCpu) {
  const int64_t n = 70, k = 4, P = n * k, hidden = 2048, inter = 1792, G = inter / 128;
  const std::vector<int32_t> offsets = {0, 50, 50, 131, 280};
  const int64_t E = int64_t(offsets.size()) - 1;
  std::vector<int32_t> dest(static_cast<size_t>(P));  // a shuffle of the rows
  for (int64_t i = 0; i < P; ++i) dest[size_t(i)] = int32_t(i);
  for (int64_t i = P - 1; i > 0; --i) std::swap(dest[size_t(i)], dest[size_t((i * 7919 + 17) % (i + 1))]);
  dest[5] = -1, dest[66] = -1;  // dropped pairs
  auto out = rand_vec(size_t(P * hidden), 30, 5e4f);
  const auto raw = round_to<__nv_bfloat16>(out);
  auto wts = rand_vec(size_t(P), 31), sa = rand_vec(size_t(P * G), 32, 1e-2f);
  const auto sw = rand_vec(size_t(E * G * hidden), 33, 1e-3f);
  for (float& v : sa) v = std::fabs(v) + 1e-4f;
  const auto x0 = rand_vec(size_t(n * hidden), 34);
  DevBuf<__nv_bfloat16> d_out(raw.size());
  DevBuf<int32_t> d_dest(dest.size()), d_off(offsets.size());
  DevBuf<float> d_w(wts.size()), d_sa(sa.size()), d_sw(sw.size()), d_x(x0.size());
  upload(d_out, raw);
  upload(d_dest, dest);
  upload(d_off, offsets);
  upload(d_w, wts);
  upload(d_sa, sa);
  upload(d_sw, sw);
  upload(d_x, x0);
  cuda::moe_combine_fp8_scaled(d_x.get(), d_out.get(), d_dest.get(), d_w.get(), d_sa.get(), d_sw.get(), d_off.get(), n,
                               E, k, hidden, inter, this->stream_);
  this->sync();
  std::vector<float> want = x0;
  cpu::moe_combine_fp8_scaled(want.data(), out.data(), dest.data(), wts.data(), sa.data(), sw.data(), offsets.data(), n,
                              E, k, hidden, inter);
  EXPECT_TRUE(norm_close(download(d_x.get(), want.size()), want, 1e-6));
}

// The products at a ragged small shape and at the model's widths (gate/up 2048 -> 2 x 1792 cut to 512
// columns to keep the CPU reference quick; down 1792 -> 2048); both weight schemes, both activation
// groupings.
TYPED_TEST(CudaFp8Grouped, ProductMatchesCpu) {
  using T = TypeParam;
  struct Case {
    std::vector<int32_t> offsets;
    int64_t n_in, n_out;
  };
  const std::vector<Case> cases = {{{0, 70, 70, 181, 250, 300}, 256, 384},
                                   {{0, 1, 65, 200, 260}, 2048, 512},
                                   {{0, 130, 131, 256}, 1792, 2048}};
  for (const Case& c : cases)
    for (const Fp8Scheme scheme : {Fp8Scheme::Block128, Fp8Scheme::Channel})
      for (const bool per_row : {false, true}) {
        const int64_t E = int64_t(c.offsets.size()) - 1, rows = c.offsets.back();
        SCOPED_TRACE(cat(E, " experts, ", rows, " rows, ", c.n_in, " -> ", c.n_out, ", ", fp8_scheme_name(scheme),
                         per_row ? ", activations per row" : ", activations per 128"));
        auto x = rand_vec(size_t(rows * c.n_in), 7, 2.f);
        const auto raw = round_to<T>(x);
        const Experts w = make_experts(E, c.n_out, c.n_in, scheme, 8);
        DevBuf<T> d_x(raw.size());
        DevBuf<int32_t> d_off(c.offsets.size());
        DevBuf<uint8_t> d_q(size_t(rows * c.n_in)), d_w(w.q.size());
        DevBuf<float> d_sa(size_t(rows * c.n_in / 128)), d_sw(w.s.size());
        DevBuf<__nv_bfloat16> d_out(size_t(rows * c.n_out));
        DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(E)));
        upload(d_x, raw);
        upload(d_off, c.offsets);
        upload(d_w, w.q);
        upload(d_sw, w.s);
        cuda::moe_quantize_e4m3(d_q.get(), d_sa.get(), d_x.get(), nullptr, d_off.get(), rows, E, c.n_in, per_row,
                                this->stream_);
        cuda::moe_grouped_matmul_fp8(d_out.get(), d_q.get(), d_sa.get(), d_w.get(), d_sw.get(), scheme,
                                     d_off.get(), rows, E, c.n_in, c.n_out, ws.get(), this->stream_);
        this->sync();
        std::vector<uint8_t> q(size_t(rows * c.n_in));
        std::vector<float> sa(size_t(rows * c.n_in / 128)), want(size_t(rows * c.n_out));
        cpu::moe_quantize_e4m3(q.data(), sa.data(), x.data(), nullptr, c.offsets.data(), rows, E, c.n_in, per_row);
        cpu::moe_grouped_matmul_fp8(want.data(), q.data(), sa.data(), w.q.data(), w.s.data(), scheme,
                                    c.offsets.data(), E, c.n_in, c.n_out);
        EXPECT_TRUE(close_t<__nv_bfloat16>(download(d_out.get(), want.size()), want));
      }
}

// The quantization's codes of v / s against the CPU's for every bf16 ratio: a group's amax at each
// of the 128 bf16 mantissas, its other 127 values every bf16 of at most that magnitude (both signs,
// subnormals, zero). A code rule that rounds near e4m3's midpoints otherwise fails it (v * (1 / s)
// with the division only at exact midpoints: 208 of the 4.18 M codes; results.md, twenty-third
// session, call 5).
TEST_F(CudaTest, Fp8QuantizeEveryBf16RatioMatchesCpu) {
  std::vector<float> x;
  for (uint32_t m = 0; m < 128; ++m) {
    const float amax = bf16_to_float(uint16_t(0x3f80 | m));  // 1 + m / 128
    std::vector<float> vals;
    for (uint32_t b = 0; b < 0x10000; ++b)
      if (const float v = bf16_to_float(uint16_t(b)); std::fabs(v) <= amax) vals.push_back(v);
    for (size_t i = 0; i < vals.size(); i += 127) {
      x.push_back(amax);
      for (size_t j = i; j < i + 127; ++j) x.push_back(j < vals.size() ? vals[j] : 0.f);
    }
  }
  const int64_t rows = int64_t(x.size()) / 128, cols = 128;
  const std::vector<int32_t> offsets = {0, int32_t(rows)};
  const auto raw = round_to<__nv_bfloat16>(x);  // exact: every value is a bf16
  DevBuf<__nv_bfloat16> d_x(raw.size());
  DevBuf<int32_t> d_off(2);
  DevBuf<uint8_t> d_q(x.size());
  DevBuf<float> d_s(static_cast<size_t>(rows));
  upload(d_x, raw);
  upload(d_off, offsets);
  cuda::moe_quantize_e4m3(d_q.get(), d_s.get(), d_x.get(), nullptr, d_off.get(), rows, 1, cols, false, this->stream_);
  this->sync();
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(static_cast<size_t>(rows));
  cpu::moe_quantize_e4m3(q.data(), s.data(), x.data(), nullptr, offsets.data(), rows, 1, cols, false);
  const auto got = byte_download(d_q.get(), q.size());
  int64_t differ = 0;
  for (size_t i = 0; i < q.size(); ++i) differ += got[i] != q[i];
  EXPECT_EQ(differ, 0) << "of " << q.size() << " codes";
  EXPECT_EQ(download(d_s.get(), s.size()), s);
}

// Every block128 configuration of the blockwise kernel (its clusters) and tile schedule (raster
// order, swizzle) gives the default's bits: a tile's sums do not depend on them.
TEST_F(CudaTest, Fp8Block128ConfigurationsGiveTheSameBits) {
  const std::vector<int32_t> offsets = {0, 1, 130, 130, 300, 557, 640};  // an empty expert, ragged tiles
  const int64_t E = int64_t(offsets.size()) - 1, rows = offsets.back(), n_in = 1792, n_out = 2048;
  const auto x = rand_vec(size_t(rows * n_in), 17, 2.f);
  std::vector<uint8_t> q(x.size());
  std::vector<float> sa(size_t(rows * n_in / 128));
  cpu::moe_quantize_e4m3(q.data(), sa.data(), x.data(), nullptr, offsets.data(), rows, E, n_in, false);
  const Experts w = make_experts(E, n_out, n_in, Fp8Scheme::Block128, 18);
  DevBuf<int32_t> d_off(offsets.size());
  DevBuf<uint8_t> d_q(q.size()), d_w(w.q.size());
  DevBuf<float> d_sa(sa.size()), d_sw(w.s.size());
  DevBuf<__nv_bfloat16> d_out(size_t(rows * n_out));
  DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(E)));
  upload(d_off, offsets);
  upload(d_q, q);
  upload(d_sa, sa);
  upload(d_w, w.q);
  upload(d_sw, w.s);
  auto product = [&] {
    CUDA_CHECK(cudaMemset(d_out.get(), 0xff, size_t(rows * n_out) * 2));
    cuda::moe_grouped_matmul_fp8(d_out.get(), d_q.get(), d_sa.get(), d_w.get(), d_sw.get(), Fp8Scheme::Block128,
                                 d_off.get(), rows, E, n_in, n_out, ws.get(), this->stream_);
    this->sync();
    return byte_download(reinterpret_cast<const uint8_t*>(d_out.get()), size_t(rows * n_out) * 2);
  };
  const auto want = product();
  for (int c = 0; c < cuda::grouped::kFp8BlockConfigCount; ++c)
    for (const bool along_n : {false, true})
      for (const int swizzle : {1, 8}) {
        SCOPED_TRACE(cat(cuda::grouped::fp8_block_config_name(c), along_n ? ", along N" : ", along M", ", swizzle ",
                         swizzle));
        cuda::grouped::force_fp8_block_config(c);
        cuda::grouped::set_fp8_block_schedule(along_n, swizzle);
        EXPECT_EQ(product(), want);
      }
  cuda::grouped::force_fp8_block_config(-1);
  cuda::grouped::set_fp8_block_schedule(false, 1);
  EXPECT_THROW(cuda::grouped::set_fp8_block_schedule(false, 3), Error);
  EXPECT_THROW(cuda::grouped::force_fp8_block_config(cuda::grouped::kFp8BlockConfigCount), Error);
  EXPECT_THROW(cuda::grouped::fp8_block_config_name(-1), Error);
}

// The grouped rows of `offsets` laid out padded per expert (moe_padded_rows' layout): codes (zero
// rows for the padding), scales (1 for padding rows), the tiles' experts and the rows in use.
struct PaddedRows {
  int64_t m_pad = 0, used = 0;
  std::vector<int32_t> row;  // grouped row r -> padded row
  std::vector<uint8_t> q;
  std::vector<float> s;
  std::vector<int32_t> tile_expert;
};

PaddedRows pad_rows(const std::vector<int32_t>& offsets, const std::vector<uint8_t>& q, const std::vector<float>& sa,
                    int64_t cols) {
  const int64_t E = int64_t(offsets.size()) - 1, G = cols / 128;
  PaddedRows p;
  p.m_pad = cuda::moe_padded_rows(offsets.back(), E);
  p.row.resize(size_t(offsets.back()));
  p.q.assign(size_t(p.m_pad * cols), 0);
  p.s.assign(size_t(p.m_pad * G), 1.f);
  p.tile_expert.assign(size_t(p.m_pad / 128), int32_t(E - 1));
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets[size_t(e)], m = offsets[size_t(e + 1)] - r0;
    for (int64_t i = 0; i < m; ++i) {
      p.row[size_t(r0 + i)] = int32_t(at + i);
      std::copy_n(q.begin() + (r0 + i) * cols, cols, p.q.begin() + (at + i) * cols);
      for (int64_t g = 0; g < G; ++g) p.s[size_t(g * p.m_pad + at + i)] = sa[size_t(r0 * G + g * m + i)];
    }
    const int64_t tiles = (m + 127) / 128;
    std::fill_n(p.tile_expert.begin() + at / 128, tiles, int32_t(e));
    at += tiles * 128;
  }
  p.used = at;
  return p;
}

// Both padded products' schedulers in turn (the counter's, the default, then the static stride's),
// the setting before given back however the body ends.
template <class Body>
void for_each_padded_scheduler(Body body) {
  struct Restore {
    bool was = cuda::grouped::fp8_padded_dynamic();
    ~Restore() { cuda::grouped::set_fp8_padded_dynamic(was); }
  } restore;
  for (const bool dynamic : {true, false}) {
    SCOPED_TRACE(dynamic ? "units from the counter" : "units by the static stride");
    cuda::grouped::set_fp8_padded_dynamic(dynamic);
    body();
  }
}

// moe_pad_rows against cpu::moe_pad_rows on moe_permute's grouping of random routings: empty experts,
// dropped pairs (expert -1), more padded rows than needed; the rows in use are the experts' row counts
// rounded up to 128.
TEST_F(CudaTest, Fp8PadRowsMatchesCpu) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> routings = {{1, 4, 2}, {300, 8, 4}, {2000, 32, 4}};
  for (const auto& [n, E, k] : routings) {
    SCOPED_TRACE(cat(n, " tokens, ", E, " experts, top-", k));
    const int64_t P = n * k, m_pad = cuda::moe_padded_rows(P, E) + (n == 300 ? 256 : 0);
    std::vector<int32_t> experts(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) experts[size_t(i)] = int32_t((i * 7 + i / 3) % (E - 1));  // expert E-1 empty
    if (P > 10) experts[3] = experts[10] = -1;                                                // dropped
    const size_t pairs = static_cast<size_t>(P), padded = static_cast<size_t>(m_pad), n_tiles = padded / 128;
    DevBuf<int32_t> d_e(experts.size()), d_off(static_cast<size_t>(E + 1)), d_src(pairs), d_dest(pairs);
    DevBuf<int32_t> d_scr(size_t(cuda::moe_permute_scratch_ints(n, E, k)));
    DevBuf<int32_t> d_spad(padded), d_dpad(pairs), d_tiles(n_tiles), d_one(2), d_used(1);
    upload(d_e, experts);
    cuda::moe_permute(d_off.get(), d_src.get(), d_dest.get(), d_e.get(), n, E, k, d_scr.get(), this->stream_);
    cuda::moe_pad_rows(d_spad.get(), d_dpad.get(), d_tiles.get(), d_one.get(), d_used.get(), d_off.get(), d_src.get(),
                       d_dest.get(), P, E, m_pad, this->stream_);
    this->sync();
    const auto off = int_download(d_off.get(), size_t(E + 1)), src = int_download(d_src.get(), size_t(P)),
               dest = int_download(d_dest.get(), size_t(P));
    std::vector<int32_t> spad(padded), dpad(pairs), tiles(n_tiles), one(2);
    int32_t used = -1;
    cpu::moe_pad_rows(spad.data(), dpad.data(), tiles.data(), one.data(), &used, off.data(), src.data(), dest.data(),
                      P, E, m_pad);
    int64_t want_used = 0;
    for (int64_t e = 0; e < E; ++e) want_used += (off[size_t(e + 1)] - off[size_t(e)] + 127) / 128 * 128;
    EXPECT_EQ(used, want_used);
    EXPECT_LE(used, m_pad);
    EXPECT_EQ(int_download(d_used.get(), 1), std::vector<int32_t>{used});
    EXPECT_EQ(int_download(d_spad.get(), spad.size()), spad);
    EXPECT_EQ(int_download(d_dpad.get(), dpad.size()), dpad);
    EXPECT_EQ(int_download(d_tiles.get(), tiles.size()), tiles);
    EXPECT_EQ(int_download(d_one.get(), 2), (std::vector<int32_t>{0, int32_t(m_pad)}));
    for (int64_t i = 0; i < P; ++i) {  // each kept pair's padded row holds its token, inside its expert's tiles
      if (experts[size_t(i)] < 0) {
        EXPECT_EQ(dpad[size_t(i)], -1);
        continue;
      }
      ASSERT_GE(dpad[size_t(i)], 0);
      EXPECT_EQ(spad[size_t(dpad[size_t(i)])], i / k);
      EXPECT_EQ(tiles[size_t(dpad[size_t(i)] / 128)], experts[size_t(i)]);
    }
  }
  DevBuf<int32_t> d(size_t(1024));
  EXPECT_THROW(cuda::moe_pad_rows(d.get(), d.get(), d.get(), d.get(), d.get(), d.get(), d.get(), d.get(), 100, 4,
                                  128, this->stream_),
               Error);  // fewer padded rows than moe_padded_rows
}

// Eight experts' 4,200 rows: 41 padded M tiles, several units for every cluster of 132 SMs (the
// counter's ring of 4 slots wraps), empty tiles past the rows in use.
const std::vector<int32_t> kManyUnits = {0, 500, 1000, 1700, 2300, 2301, 3100, 3900, 4200};

// The padded product (one GEMM, the tile's expert per 128 rows) gives the grouped kernel's bits for
// every row, zeros for the padding rows: empty experts, one-row experts, a tile boundary on the dot,
// many units a cluster; with either scheduler. With the rows in use given, the tiles past them are
// skipped (their rows keep what was there); without, every row is computed (the tail's zero codes
// give zeros).
TEST_F(CudaTest, Fp8PaddedProductGivesTheGroupedBits) {
  struct Case {
    std::vector<int32_t> offsets;
    int64_t n_in, n_out;
  };
  const std::vector<Case> cases = {{{0, 1, 130, 130, 300, 557, 640}, 1792, 2048},
                                   {{0, 0, 128, 129, 400, 400}, 256, 384},
                                   {{0, 300, 301, 302, 700}, 2048, 3584},
                                   {kManyUnits, 256, 2048}};
  for_each_padded_scheduler([&] {
    for (const Case& c : cases) {
      const int64_t E = int64_t(c.offsets.size()) - 1, rows = c.offsets.back();
      const auto x = rand_vec(size_t(rows * c.n_in), 21, 2.f);
      std::vector<uint8_t> q(x.size());
      std::vector<float> sa(size_t(rows * c.n_in / 128));
      cpu::moe_quantize_e4m3(q.data(), sa.data(), x.data(), nullptr, c.offsets.data(), rows, E, c.n_in, false);
      const Experts w = make_experts(E, c.n_out, c.n_in, Fp8Scheme::Block128, 22);
      const PaddedRows p = pad_rows(c.offsets, q, sa, c.n_in);
      ASSERT_LT(p.used, p.m_pad) << "a case without tiles to skip";
      DevBuf<int32_t> d_off(c.offsets.size()), d_tiles(p.tile_expert.size()), d_used(1);
      DevBuf<uint8_t> d_q(q.size()), d_pq(p.q.size()), d_w(w.q.size());
      DevBuf<float> d_sa(sa.size()), d_ps(p.s.size()), d_sw(w.s.size());
      DevBuf<__nv_bfloat16> d_out(size_t(rows * c.n_out)), d_pout(size_t(p.m_pad * c.n_out));
      DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(E)));
      upload(d_off, c.offsets);
      upload(d_tiles, p.tile_expert);
      upload(d_used, std::vector<int32_t>{int32_t(p.used)});
      upload(d_q, q);
      upload(d_pq, p.q);
      upload(d_sa, sa);
      upload(d_ps, p.s);
      upload(d_w, w.q);
      upload(d_sw, w.s);
      cuda::moe_grouped_matmul_fp8(d_out.get(), d_q.get(), d_sa.get(), d_w.get(), d_sw.get(), Fp8Scheme::Block128,
                                   d_off.get(), rows, E, c.n_in, c.n_out, ws.get(), this->stream_);
      const size_t row_bytes = size_t(c.n_out) * 2;
      const auto want = byte_download(reinterpret_cast<const uint8_t*>(d_out.get()), size_t(rows) * row_bytes);
      for (const bool skip : {true, false}) {
        SCOPED_TRACE(cat(E, " experts, ", rows, " rows, ", c.n_in, " -> ", c.n_out,
                         skip ? ", the tiles past the rows in use skipped" : ", every tile"));
        CUDA_CHECK(cudaMemset(d_pout.get(), 0xff, size_t(p.m_pad * c.n_out) * 2));
        cuda::moe_grouped_matmul_fp8_padded(d_pout.get(), d_pq.get(), d_ps.get(), d_w.get(), d_sw.get(), d_tiles.get(),
                                            skip ? d_used.get() : nullptr, p.m_pad, E, c.n_in, c.n_out, ws.get(),
                                            this->stream_);
        this->sync();
        const auto got = byte_download(reinterpret_cast<const uint8_t*>(d_pout.get()), size_t(p.m_pad) * row_bytes);
        std::vector<bool> real(size_t(p.m_pad), false);
        int64_t differ = 0, nonzero_pad = 0, tail_written = 0;
        for (int64_t r = 0; r < rows; ++r) {
          real[size_t(p.row[size_t(r)])] = true;
          differ += !std::equal(want.begin() + r * row_bytes, want.begin() + (r + 1) * row_bytes,
                                got.begin() + p.row[size_t(r)] * row_bytes);
        }
        for (int64_t r = 0; r < p.m_pad; ++r) {
          if (real[size_t(r)]) continue;
          const auto b = got.begin() + r * row_bytes, e = b + int64_t(row_bytes);
          if (skip && r >= p.used)
            tail_written += std::any_of(b, e, [](uint8_t v) { return v != 0xff; });
          else
            nonzero_pad += std::any_of(b, e, [](uint8_t v) { return v != 0; });
        }
        EXPECT_EQ(differ, 0) << "rows whose bits differ from the grouped kernel's";
        EXPECT_EQ(nonzero_pad, 0) << "padding rows not zero";
        EXPECT_EQ(tail_written, 0) << "rows past the rows in use written";
      }
    }
  });
  DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(2)));
  EXPECT_THROW(cuda::moe_grouped_matmul_fp8_padded(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 100,
                                                   2, 128, 128, ws.get(), this->stream_),
               Error);  // rows not a multiple of 128
}

// Gate/up with the SwiGLU in its epilogue (moe_grouped_matmul_fp8_padded_swiglu) gives the codes and
// scales of the padded product followed by moe_swiglu_quantize_e4m3 for every row in use, padding
// rows included (zero codes, scales 1), and leaves the rows past them as they were: empty and
// one-row experts, inter of one cluster's gate tiles (256), of several, the model's (1,792), a
// large-magnitude case whose groups saturate nothing but span the codes, many units a cluster; with
// either scheduler.
TEST_F(CudaTest, Fp8PaddedSwigluGivesTheUnfusedBits) {
  struct Case {
    std::vector<int32_t> offsets;
    int64_t n_in, inter;
    float x_scale;
  };
  const std::vector<Case> cases = {{{0, 1, 130, 130, 300}, 128, 256, 2.f},
                                   {{0, 0, 128, 129, 400, 400, 530}, 2048, 512, 2.f},
                                   {{0, 300, 301, 302, 700}, 2048, 1792, 2.f},
                                   {{0, 200, 457}, 256, 768, 40.f},
                                   {kManyUnits, 256, 1792, 2.f}};
  for_each_padded_scheduler([&] {
    for (const Case& c : cases) {
      const int64_t E = int64_t(c.offsets.size()) - 1, rows = c.offsets.back(), I = c.inter;
      SCOPED_TRACE(cat(E, " experts, ", rows, " rows, ", c.n_in, " -> 2 x ", I));
      const auto x = rand_vec(size_t(rows * c.n_in), 31, c.x_scale);
      std::vector<uint8_t> q(x.size());
      std::vector<float> sa(size_t(rows * c.n_in / 128));
      cpu::moe_quantize_e4m3(q.data(), sa.data(), x.data(), nullptr, c.offsets.data(), rows, E, c.n_in, false);
      const Experts w = make_experts(E, 2 * I, c.n_in, Fp8Scheme::Block128, 32);
      const PaddedRows p = pad_rows(c.offsets, q, sa, c.n_in);
      std::vector<int32_t> pad_src(size_t(p.m_pad), -1), one = {0, int32_t(p.m_pad)};
      for (int64_t r = 0; r < rows; ++r) pad_src[size_t(p.row[size_t(r)])] = int32_t(r);
      const size_t n_codes = size_t(p.m_pad * I), n_scales = size_t(p.m_pad * I / 128);
      DevBuf<int32_t> d_tiles(p.tile_expert.size()), d_used(1), d_pad(pad_src.size()), d_one(2);
      DevBuf<uint8_t> d_pq(p.q.size()), d_w(w.q.size()), d_q1(n_codes), d_q2(n_codes);
      DevBuf<float> d_ps(p.s.size()), d_sw(w.s.size()), d_s1(n_scales), d_s2(n_scales);
      DevBuf<__nv_bfloat16> d_gu(size_t(p.m_pad * 2 * I));
      DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(E)));
      upload(d_tiles, p.tile_expert);
      upload(d_used, std::vector<int32_t>{int32_t(p.used)});
      upload(d_pad, pad_src);
      upload(d_one, one);
      upload(d_pq, p.q);
      upload(d_ps, p.s);
      upload(d_w, w.q);
      upload(d_sw, w.s);
      CUDA_CHECK(cudaMemset(d_q2.get(), 0xab, n_codes));
      CUDA_CHECK(cudaMemset(d_s2.get(), 0xab, n_scales * 4));
      cuda::moe_grouped_matmul_fp8_padded(d_gu.get(), d_pq.get(), d_ps.get(), d_w.get(), d_sw.get(), d_tiles.get(),
                                          d_used.get(), p.m_pad, E, c.n_in, 2 * I, ws.get(), this->stream_);
      cuda::moe_swiglu_quantize_e4m3(d_q1.get(), d_s1.get(), d_gu.get(), d_pad.get(), d_one.get(), p.m_pad, 1, I, false,
                                     this->stream_);
      cuda::moe_grouped_matmul_fp8_padded_swiglu(d_q2.get(), d_s2.get(), d_pq.get(), d_ps.get(), d_w.get(), d_sw.get(),
                                                 d_tiles.get(), d_used.get(), p.m_pad, E, c.n_in, I, ws.get(),
                                                 this->stream_);
      this->sync();
      const auto q1 = byte_download(d_q1.get(), n_codes), q2 = byte_download(d_q2.get(), n_codes);
      const auto s1 = download(d_s1.get(), n_scales), s2 = download(d_s2.get(), n_scales);
      int64_t code_rows = 0, scale_rows = 0, tail_written = 0, nonzero_codes = 0;
      for (int64_t r = 0; r < p.m_pad; ++r) {
        const auto b1 = q1.begin() + r * I, b2 = q2.begin() + r * I;
        bool scales_equal = true, tail_kept = true;
        for (int64_t g = 0; g < I / 128; ++g) {
          const size_t at = size_t(g * p.m_pad + r);
          scales_equal = scales_equal && std::memcmp(&s1[at], &s2[at], 4) == 0;
          uint32_t bits;
          std::memcpy(&bits, &s2[at], 4);
          tail_kept = tail_kept && bits == 0xababababu;
        }
        if (r >= p.used) {
          tail_written += !tail_kept || std::any_of(b2, b2 + I, [](uint8_t v) { return v != 0xab; });
          continue;
        }
        code_rows += !std::equal(b1, b1 + I, b2);
        scale_rows += !scales_equal;
        nonzero_codes += std::count_if(b2, b2 + I, [](uint8_t v) { return (v & 0x7f) != 0; });
      }
      EXPECT_EQ(code_rows, 0) << "rows in use whose codes differ from the unfused path's";
      EXPECT_EQ(scale_rows, 0) << "rows in use whose scales differ from the unfused path's";
      EXPECT_EQ(tail_written, 0) << "rows past the rows in use written";
      EXPECT_GT(nonzero_codes, rows * I / 2) << "a product of mostly zero codes proves little";
    }
  });
}

// LFM2_FP8_PADDED_SCHED: unset or empty the counter's scheduler, static the stride's, anything else
// refused in one line naming the variable and what it takes (no GPU needed).
TEST(Fp8PaddedSchedule, TheVariableIsReadOrRefused) {
  const char* kName = "LFM2_FP8_PADDED_SCHED";
  const char* before = std::getenv(kName);
  const std::string was = before ? before : "";
  unsetenv(kName);
  EXPECT_TRUE(cuda::grouped::fp8_padded_dynamic_from_env());
  for (const auto& [value, dynamic] : std::vector<std::pair<const char*, bool>>{
           {"", true}, {"dynamic", true}, {"static", false}}) {
    setenv(kName, value, 1);
    EXPECT_EQ(cuda::grouped::fp8_padded_dynamic_from_env(), dynamic) << "'" << value << "'";
  }
  for (const char* bad : {"Static", "dynamic ", "1", "stride"}) {
    setenv(kName, bad, 1);
    try {
      cuda::grouped::fp8_padded_dynamic_from_env();
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(kName) + "='" + bad + "': not one of dynamic, static"), std::string::npos)
          << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
  if (before)
    setenv(kName, was.c_str(), 1);
  else
    unsetenv(kName);
}

// The fused gate/up refuses, in one line and before any launch, an inter its tiles cannot pair and
// rows that are not whole tiles.
TEST_F(CudaTest, Fp8PaddedSwigluRefusesBadShapes) {
  DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(2)));
  DevBuf<uint8_t> d(size_t(1) << 20);
  DevBuf<float> f(size_t(1) << 16);
  DevBuf<int32_t> t(size_t(8));
  EXPECT_THROW(cuda::moe_grouped_matmul_fp8_padded_swiglu(d.get(), f.get(), d.get(), f.get(), d.get(), f.get(),
                                                          t.get(), nullptr, 128, 2, 128, 384, ws.get(), this->stream_),
               Error);  // inter not a multiple of 256
  EXPECT_THROW(cuda::moe_grouped_matmul_fp8_padded_swiglu(d.get(), f.get(), d.get(), f.get(), d.get(), f.get(),
                                                          t.get(), nullptr, 100, 2, 128, 256, ws.get(), this->stream_),
               Error);  // rows not a multiple of 128
}

// The channel scheme's raw products (no scales) at the shapes of ProductMatchesCpu.
TEST_F(CudaTest, Fp8RawProductMatchesCpu) {
  struct Case {
    std::vector<int32_t> offsets;
    int64_t n_in, n_out;
  };
  const std::vector<Case> cases = {{{0, 70, 70, 181, 250, 300}, 256, 384},
                                   {{0, 1, 65, 200, 260}, 2048, 512},
                                   {{0, 130, 131, 256}, 1792, 2048}};
  for (const Case& c : cases) {
    const int64_t E = int64_t(c.offsets.size()) - 1, rows = c.offsets.back();
    SCOPED_TRACE(cat(E, " experts, ", rows, " rows, ", c.n_in, " -> ", c.n_out));
    const auto x = rand_vec(size_t(rows * c.n_in), 7, 2.f);
    std::vector<uint8_t> q(x.size());
    std::vector<float> sa(size_t(rows * c.n_in / 128)), want(size_t(rows * c.n_out));
    cpu::moe_quantize_e4m3(q.data(), sa.data(), x.data(), nullptr, c.offsets.data(), rows, E, c.n_in, true);
    const Experts w = make_experts(E, c.n_out, c.n_in, Fp8Scheme::Channel, 8);
    DevBuf<int32_t> d_off(c.offsets.size());
    DevBuf<uint8_t> d_q(q.size()), d_w(w.q.size());
    DevBuf<__nv_bfloat16> d_out(want.size());
    DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(E)));
    upload(d_off, c.offsets);
    upload(d_q, q);
    upload(d_w, w.q);
    cuda::moe_grouped_matmul_fp8_raw(d_out.get(), d_q.get(), d_w.get(), d_off.get(), rows, E, c.n_in, c.n_out, ws.get(),
                                     this->stream_);
    this->sync();
    cpu::moe_grouped_matmul_fp8_raw(want.data(), q.data(), w.q.data(), c.offsets.data(), E, c.n_in, c.n_out);
    double ss = 0;
    for (const float v : want) ss += double(v) * v;
    EXPECT_TRUE(close_t<__nv_bfloat16>(download(d_out.get(), want.size()), want, std::sqrt(ss / double(want.size()))));
  }
}

// The GPU's w13 of E experts (w1, w3: (E, I, H)): per expert w1's rows then w3's; its scales
// likewise per k block.
Experts stack_w13(const Experts& w1, const Experts& w3, int64_t E, int64_t I, int64_t H, Fp8Scheme scheme) {
  Experts w13{std::vector<uint8_t>(size_t(E * 2 * I * H)), {}};
  const int64_t KB = H / 128, Ns = scheme == Fp8Scheme::Channel ? I : I / 128;  // scale rows of w1
  for (int64_t e = 0; e < E; ++e) {
    std::copy_n(w1.q.begin() + e * I * H, I * H, w13.q.begin() + e * 2 * I * H);
    std::copy_n(w3.q.begin() + e * I * H, I * H, w13.q.begin() + e * 2 * I * H + I * H);
    for (int64_t kb = 0; kb < KB; ++kb) {
      const int64_t at = (e * KB + kb) * Ns;
      w13.s.insert(w13.s.end(), w1.s.begin() + at, w1.s.begin() + at + Ns);
      w13.s.insert(w13.s.end(), w3.s.begin() + at, w3.s.begin() + at + Ns);
    }
  }
  return w13;
}

// The oracle's fp32 experts (E, rows, cols): e4m3 x scale.
std::vector<float> dequantize(const Experts& x, int64_t E, int64_t rows, int64_t cols, Fp8Scheme scheme) {
  std::vector<float> out(x.q.size());
  const bool channel = scheme == Fp8Scheme::Channel;
  const int64_t NS = channel ? rows : rows / 128, CB = cols / 128;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = x.s[size_t((e * CB + c / 128) * NS + (channel ? r : r / 128))];
        out[size_t((e * rows + r) * cols + c)] = e4m3_to_float(x.q[size_t((e * rows + r) * cols + c)]) * s;
      }
  return out;
}

// The prompt rows' MoE (moe_experts_fp8) against the oracle: x + cpu::moe_experts(in) with the
// experts dequantized and the activations fake-quantized per row (channel) or per 128 columns
// (block128), as the CPU stage's fp8_activations; row 0 alone gives its batch's bits.
TYPED_TEST(CudaFp8Grouped, ExpertsMatchTheOracle) {
  using T = TypeParam;
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> shapes = {
      {64, 256, 16, 128, 4}, {200, 512, 8, 384, 2}, {96, 1024, 8, 512, 4}, {256, 2048, 32, 1792, 4}};
  for (const auto& [n, H, E, I, k] : shapes)
    for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128}) {
      SCOPED_TRACE(cat(n, " tokens, H ", H, ", E ", E, ", I ", I, ", top-", k, ", ", fp8_scheme_name(scheme)));
      const Experts w1 = make_experts(E, I, H, scheme, 50), w3 = make_experts(E, I, H, scheme, 51);
      const Experts w2 = make_experts(E, H, I, scheme, 52);
      const Experts w13 = stack_w13(w1, w3, E, I, H, scheme);
      const auto f1 = dequantize(w1, E, I, H, scheme), f3 = dequantize(w3, E, I, H, scheme);
      const auto f2 = dequantize(w2, E, H, I, scheme);
      auto in = rand_vec(size_t(n * H), 60 + uint64_t(n));
      const auto in_t = round_to<T>(in);
      const auto x0 = rand_vec(size_t(n * H), 61);
      std::vector<int32_t> experts;
      std::vector<float> weights;
      make_routing(experts, weights, n, E, k, Routing::kRandom, uint64_t(n));
      const auto need = cpu::moe_experts_scratch(n, H, E, I, k, 8);
      std::vector<float> scratch(size_t(need.floats)), ref(size_t(n * H));
      std::vector<int32_t> iscratch(size_t(need.ints));
      cpu::moe_experts(ref.data(), in.data(), f1.data(), f3.data(), f2.data(), experts.data(), weights.data(), n, H,
                       E, I, k, scratch.data(), iscratch.data(), 8,
                       scheme == Fp8Scheme::Channel ? cpu::kFp8PerRow : kFp8Block);

      DevBuf<T> d_in(in_t.size());
      DevBuf<uint8_t> d_w13(w13.q.size()), d_w2(w2.q.size());
      DevBuf<float> d_s13(w13.s.size()), d_s2(w2.s.size()), d_x(x0.size()), d_wt(weights.size());
      DevBuf<int32_t> d_e(experts.size());
      DevBuf<char> d_scratch(size_t(cuda::moe_experts_fp8_scratch_bytes(n, H, E, I, k)));
      upload(d_in, in_t);
      upload(d_w13, w13.q);
      upload(d_w2, w2.q);
      upload(d_s13, w13.s);
      upload(d_s2, w2.s);
      upload(d_x, x0);
      upload(d_wt, weights);
      upload(d_e, experts);
      std::vector<float> first;  // block128: the padded rows' result, which the other paths' must equal
      const bool channel = scheme == Fp8Scheme::Channel;
      for (const int path : {0, 1, 2}) {  // channel: plain, blockwise; block128: padded, unfused, grouped
        if (channel && path == 2) continue;
        const bool plain = path == 0;
        SCOPED_TRACE(channel ? (plain ? "plain kernel" : "channel on the blockwise kernel")
                             : (path == 0 ? "rows padded per expert"
                                          : path == 1 ? "padded, the SwiGLU not fused" : "grouped kernel"));
        cuda::grouped::set_fp8_channel_plain(!channel || plain);
        cuda::grouped::set_fp8_block_padded(channel || path < 2);
        cuda::grouped::set_fp8_swiglu_fused(path != 1);
        upload(d_x, x0);
        auto run = [&](int64_t rows) {
          cuda::moe_experts_fp8<T>(d_x.get(), d_in.get(), d_w13.get(), d_s13.get(), d_w2.get(), d_s2.get(), scheme,
                                   d_e.get(), d_wt.get(), rows, H, E, I, k, d_scratch.get(), this->stream_);
          this->sync();
        };
        run(n);
        const auto got = download(d_x.get(), x0.size());
        std::vector<float> moe(got.size());  // what the experts added
        for (size_t i = 0; i < got.size(); ++i) moe[i] = got[i] - x0[i];
        EXPECT_TRUE(norm_close(moe, ref, 0.02));
        if (!channel && !plain) {
          EXPECT_TRUE(same_bits(got, first)) << "against the padded rows with the SwiGLU fused";
        }
        if (plain) first = got;
        upload(d_x, x0);
        run(1);
        EXPECT_TRUE(same_bits(download(d_x.get(), size_t(H)), std::vector<float>(got.begin(), got.begin() + H)));
      }
      cuda::grouped::set_fp8_swiglu_fused(true);
      cuda::grouped::set_fp8_channel_plain(true);
      cuda::grouped::set_fp8_block_padded(true);
    }
}

}  // namespace
}  // namespace lfm2
