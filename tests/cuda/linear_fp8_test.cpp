// The prompt rows' FP8 projections (kernels/cuda/linear_fp8_lt.h) against their CPU twin
// (cpu::linear_fp8_act): cuda::linear_fp8 quantizes the input per row (channel) or per (row, 128
// columns) (block128) and runs cuBLASLt's e4m3 x e4m3 matmul with the file's scales, block128's row
// counts that cuBLASLt refuses padded in scratch; bf16 and fp16, the three outputs (T, fp32, +=
// fp32), the model's shapes and small ones at ragged row counts (1, a tail past a multiple of 128);
// a row's bits the same alone, in its batch and in a batch that starts one row later (the padded
// tail then holds other rows); block128 at 2 k blocks (its scale rows padded to 4) and 3 block rows.
// The prompt rows' norm with its e4m3 output (rmsnorm_quantize_e4m3), the short conv with its
// (short_conv_quantize_e4m3) and the projection on rows quantized before (linear_fp8_quantized): bit
// for bit the unfused pairs'. Skips without a GPU.
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/cuda/linear_fp8_lt.h"
#include "kernels/cuda/ops.h"
#include "kernels/fp8_products.h"

namespace lfm2 {
namespace {

using namespace test;

// The weight scales as linear_fp8_lt reads them: block128's rows of k blocks padded with zeros to a
// multiple of kFp8LtScaleColumns (as WeightUploader::reserve_block_scales_padded lays them out).
std::vector<float> lt_scales(const std::vector<float>& s, Fp8Scheme scheme, int64_t N, int64_t K) {
  if (scheme == Fp8Scheme::Channel) return s;
  const int64_t KB = K / 128, c = cuda::kFp8LtScaleColumns, KBp = (KB + c - 1) / c * c;
  std::vector<float> out(size_t(N / 128 * KBp), 0.f);
  for (int64_t r = 0; r < N / 128; ++r)
    for (int64_t kb = 0; kb < KB; ++kb) out[size_t(r * KBp + kb)] = s[size_t(r * KB + kb)];
  return out;
}

template <typename T>
class CudaLinearFp8 : public CudaTest {};
using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaLinearFp8, HalfTypes, ElemNames);

TYPED_TEST(CudaLinearFp8, MatchesCpuTwin) {
  using T = TypeParam;
  // (rows, n_in, n_out): the full model's qkv, out / conv out, conv in, dense w13, w2, and small ones
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 2048, 3072}, {7, 2048, 2048}, {33, 2048, 6144}, {200, 2048, 14336}, {129, 7168, 2048},
      {5, 256, 384},   {64, 128, 128},  {300, 512, 1536}, {128, 256, 384},    {4133, 512, 2048},
      {9, 640, 512}};
  for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128})
    for (const auto& [n, K, N] : shapes) {
      if (scheme == Fp8Scheme::Block128 && N % 128 != 0) continue;
      SCOPED_TRACE(cat(n, " rows, ", K, " -> ", N, ", ", fp8_scheme_name(scheme)));
      const auto wf = rand_vec(size_t(N * K), 70 + uint64_t(K + N), float(1 / std::sqrt(double(K))));
      std::vector<uint8_t> wq(wf.size());
      std::vector<float> ws(size_t(fp8_scale_rows(scheme, N) * fp8_scale_cols(scheme, K)));
      fp8_quantize(wq.data(), ws.data(), wf.data(), N, K, scheme);
      const std::vector<float> ws_dev = lt_scales(ws, scheme, N, K);
      auto in = rand_vec(size_t(n * K), 71 + uint64_t(n));
      const auto in_t = round_to<T>(in);  // in now holds the T values
      std::vector<float> ref(size_t(n * N));
      cpu::linear_fp8_act(ref.data(), in.data(), wq.data(), ws.data(), scheme, n, K, N, 8);
      DevBuf<T> d_in(in_t.size()), d_out_t(ref.size());
      DevBuf<uint8_t> d_w(wq.size());
      DevBuf<float> d_ws(ws_dev.size()), d_out(ref.size());
      DevBuf<char> d_scratch(size_t(cuda::linear_fp8_scratch_bytes(n, K, N)));  // poisoned (0xff: NaN)
      upload(d_in, in_t);
      upload(d_w, wq);
      upload(d_ws, ws_dev);
      auto run = [&](void* out, cuda::LtOut kind, int64_t first, int64_t rows) {
        cuda::linear_fp8<T>(out, kind, d_in.get() + first * K, d_w.get(), d_ws.get(), scheme, rows, K, N,
                            d_scratch.get(), this->stream_);
        this->sync();
      };
      run(d_out.get(), cuda::LtOut::kF32, 0, n);
      const auto got = download(d_out.get(), ref.size());
      EXPECT_TRUE(close_t<T>(got, ref));
      auto slice = [&](int64_t first, int64_t rows) {
        return std::vector<float>(got.begin() + first * N, got.begin() + (first + rows) * N);
      };
      // row 0 alone, the last row alone, rows [1, n): the bits of the whole batch
      run(d_out.get(), cuda::LtOut::kF32, 0, 1);
      EXPECT_TRUE(same_bits(download(d_out.get(), size_t(N)), slice(0, 1))) << "row 0 alone";
      if (n > 1) {
        run(d_out.get(), cuda::LtOut::kF32, n - 1, 1);
        EXPECT_TRUE(same_bits(download(d_out.get(), size_t(N)), slice(n - 1, 1))) << "the last row alone";
        run(d_out.get(), cuda::LtOut::kF32, 1, n - 1);
        EXPECT_TRUE(same_bits(download(d_out.get(), size_t((n - 1) * N)), slice(1, n - 1))) << "rows 1..n";
      }
      // += into an fp32 residual, and T out
      const auto x0 = rand_vec(ref.size(), 72);
      upload(d_out, x0);
      run(d_out.get(), cuda::LtOut::kAddF32, 0, n);
      std::vector<float> sum(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) sum[i] = x0[i] + ref[i];
      EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), sum));
      run(d_out_t.get(), cuda::LtOut::kT, 0, n);
      EXPECT_TRUE(close_t<T>(download(d_out_t.get(), ref.size()), ref));
    }
}

// rmsnorm_quantize_e4m3: the bits of rmsnorm, then quantize_rows_fp8_lt of its T rows from first_q
// on (a zero row: scale 1; a large value); the small models' widths, the full one's and the widest.
TYPED_TEST(CudaLinearFp8, FusedNormQuantizeMatchesNormThenQuantize) {
  using T = TypeParam;
  for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128})
    for (const int64_t dim : {128, 640, 2048, 8192})
      for (const auto& [n, first_q] : std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {37, 0}, {37, 5}, {6, 6}}) {
        SCOPED_TRACE(cat(n, " rows from ", first_q, ", dim ", dim, ", ", fp8_scheme_name(scheme)));
        auto x = rand_vec(size_t(n * dim), 80 + uint64_t(dim), 4.f);
        if (n > 3) std::fill(x.begin() + 3 * dim, x.begin() + 4 * dim, 0.f);
        x[size_t((n - 1) * dim + 7)] = 1e3f;
        const auto w = rand_vec(size_t(dim), 81, 2.f);
        const int64_t nq = n - first_q, G = dim / 128;
        const size_t n_s = size_t(std::max<int64_t>(nq, 1) * G);
        DevBuf<float> d_x(x.size()), d_w(w.size()), d_s(n_s), d_s_ref(n_s);
        DevBuf<T> d_out(x.size()), d_ref(x.size());
        DevBuf<uint8_t> d_q(x.size()), d_q_ref(x.size());
        DevBuf<int32_t> d_off(2);
        upload(d_x, x);
        upload(d_w, w);
        cuda::rmsnorm(d_ref.get(), d_x.get(), d_w.get(), n, dim, 1e-5f, this->stream_);
        cuda::quantize_rows_fp8_lt(d_q_ref.get(), d_s_ref.get(), d_off.get(), d_ref.get() + first_q * dim, scheme, nq,
                                   dim, this->stream_);
        DevBuf<T> d_fill(x.size());  // out's rows before the call, bytes 0x7f
        CUDA_CHECK(cudaMemset(d_fill.get(), 0x7f, x.size() * sizeof(T)));
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto fill = download(d_fill.get(), x.size());
        for (const bool prompt_out : {true, false}) {
          SCOPED_TRACE(prompt_out ? "prompt rows' T out" : "no T out past first_q");
          CUDA_CHECK(cudaMemcpyAsync(d_out.get(), d_fill.get(), x.size() * sizeof(T), cudaMemcpyDeviceToDevice,
                                     this->stream_));
          CUDA_CHECK(cudaMemsetAsync(d_q.get(), 0, x.size(), this->stream_));
          CUDA_CHECK(cudaMemsetAsync(d_s.get(), 0, n_s * sizeof(float), this->stream_));
          cuda::rmsnorm_quantize_e4m3(d_out.get(), d_q.get(), d_s.get(), d_x.get(), d_w.get(), n, first_q, dim,
                                      1e-5f, scheme == Fp8Scheme::Channel, this->stream_, prompt_out);
          this->sync();
          // without the prompt rows' T out, those rows keep the fill
          auto want = download(d_ref.get(), x.size());
          const size_t kept = size_t((prompt_out ? n : first_q) * dim);
          std::copy(fill.begin() + ptrdiff_t(kept), fill.end(), want.begin() + ptrdiff_t(kept));
          EXPECT_TRUE(same_bits(download(d_out.get(), x.size()), want)) << "norm";
          EXPECT_EQ(byte_download(d_q.get(), size_t(nq * dim)), byte_download(d_q_ref.get(), size_t(nq * dim)));
          EXPECT_TRUE(same_bits(download(d_s.get(), size_t(nq * G)), download(d_s_ref.get(), size_t(nq * G))));
        }
      }
}

// short_conv_quantize_e4m3: the bits of short_conv, then quantize_rows_fp8_lt (block128) of its T
// rows (a zero group: scale 1; a large value); sequence lengths past a multiple of the 4-row window,
// the small models' widths and the full one's; 3 taps only.
TYPED_TEST(CudaLinearFp8, FusedConvQuantizeMatchesConvThenQuantize) {
  using T = TypeParam;
  for (const auto& [n_seq, S, H, L] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {1, 1, 128, 3}, {2, 9, 384, 3}, {3, 42, 640, 3}, {4, 32, 2048, 3}}) {
    SCOPED_TRACE(cat(n_seq, " x ", S, " rows, hidden ", H, ", L ", L));
    const int64_t n = n_seq * S, G = H / 128;
    auto bcx = rand_vec(size_t(n * 3 * H), 95 + uint64_t(H), 2.f);
    std::fill(bcx.begin() + H, bcx.begin() + H + 128, 0.f);  // row 0's C of group 0: a zero group
    if (n > 1) bcx[size_t((n - 1) * 3 * H + H + 5)] = 1e3f;   // a large C in the last row
    const auto w = rand_vec(size_t(H * L), 96);
    const auto raw = round_to<T>(bcx);
    DevBuf<T> d_bcx(raw.size()), d_z(size_t(n * H));
    DevBuf<float> d_w(w.size()), d_s(size_t(n * G)), d_s_ref(size_t(n * G));
    DevBuf<uint8_t> d_q(size_t(n * H)), d_q_ref(size_t(n * H));
    DevBuf<int32_t> d_off(2);
    upload(d_bcx, raw);
    upload(d_w, w);
    cuda::short_conv(d_z.get(), d_bcx.get(), d_w.get(), n_seq, S, H, L, this->stream_);
    cuda::quantize_rows_fp8_lt(d_q_ref.get(), d_s_ref.get(), d_off.get(), d_z.get(), Fp8Scheme::Block128, n, H,
                               this->stream_);
    cuda::short_conv_quantize_e4m3(d_q.get(), d_s.get(), d_bcx.get(), d_w.get(), n_seq, S, H, L, this->stream_);
    this->sync();
    EXPECT_EQ(byte_download(d_q.get(), size_t(n * H)), byte_download(d_q_ref.get(), size_t(n * H)));
    const auto s = download(d_s.get(), size_t(n * G));
    EXPECT_TRUE(same_bits(s, download(d_s_ref.get(), size_t(n * G))));
    EXPECT_EQ(s[0], 1.f);  // the zero group
  }
  DevBuf<T> d_bcx(3 * 64);
  DevBuf<float> d_w(64 * 3), d_s(1);
  DevBuf<uint8_t> d_q(64);
  EXPECT_THROW(cuda::short_conv_quantize_e4m3(d_q.get(), d_s.get(), d_bcx.get(), d_w.get(), 1, 1, 64, 3,
                                              this->stream_),
               Error);  // hidden not a multiple of 128
  DevBuf<T> d_bcx2(3 * 128);
  DevBuf<float> d_w2(128 * 4);
  DevBuf<uint8_t> d_q2(128);
  EXPECT_THROW(cuda::short_conv_quantize_e4m3(d_q2.get(), d_s.get(), d_bcx2.get(), d_w2.get(), 1, 1, 128, 4,
                                              this->stream_),
               Error);  // 4 taps
}

// linear_fp8_quantized on rows quantized before (their scales' leading dimension past the rows
// taken): linear_fp8's bits, block128's tail included.
TYPED_TEST(CudaLinearFp8, QuantizedRowsMatchLinearFp8) {
  using T = TypeParam;
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {5, 256, 384}, {128, 256, 384}, {300, 512, 1536}, {129, 2048, 2048}};
  for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128})
    for (const auto& [n, K, N] : shapes) {
      SCOPED_TRACE(cat(n, " rows, ", K, " -> ", N, ", ", fp8_scheme_name(scheme)));
      const int64_t ld = n + 7;  // quantized rows past the n taken
      const auto wf = rand_vec(size_t(N * K), 90 + uint64_t(K + N), float(1 / std::sqrt(double(K))));
      std::vector<uint8_t> wq(wf.size());
      std::vector<float> ws(size_t(fp8_scale_rows(scheme, N) * fp8_scale_cols(scheme, K)));
      fp8_quantize(wq.data(), ws.data(), wf.data(), N, K, scheme);
      const std::vector<float> ws_dev = lt_scales(ws, scheme, N, K);
      auto in = rand_vec(size_t(ld * K), 91 + uint64_t(n));
      const auto in_t = round_to<T>(in);
      DevBuf<T> d_in(in_t.size());
      DevBuf<uint8_t> d_w(wq.size()), d_q(size_t(ld * K));
      DevBuf<float> d_ws(ws_dev.size()), d_s(size_t(ld * K / 128)), d_out(size_t(n * N)), d_ref(size_t(n * N));
      DevBuf<int32_t> d_off(2);
      DevBuf<char> d_scratch(size_t(cuda::linear_fp8_scratch_bytes(n, K, N)));
      upload(d_in, in_t);
      upload(d_w, wq);
      upload(d_ws, ws_dev);
      for (const cuda::LtOut kind : {cuda::LtOut::kF32, cuda::LtOut::kAddF32}) {
        const auto x0 = rand_vec(size_t(n * N), 92);
        upload(d_ref, x0);
        upload(d_out, x0);
        cuda::linear_fp8<T>(d_ref.get(), kind, d_in.get(), d_w.get(), d_ws.get(), scheme, n, K, N, d_scratch.get(),
                            this->stream_);
        cuda::quantize_rows_fp8_lt(d_q.get(), d_s.get(), d_off.get(), d_in.get(), scheme, ld, K, this->stream_);
        cuda::linear_fp8_quantized<T>(d_out.get(), kind, d_q.get(), d_s.get(), ld, d_w.get(), d_ws.get(), scheme, n,
                                      K, N, d_scratch.get(), this->stream_);
        this->sync();
        EXPECT_TRUE(same_bits(download(d_out.get(), size_t(n * N)), download(d_ref.get(), size_t(n * N))));
      }
    }
}

}  // namespace
}  // namespace lfm2
