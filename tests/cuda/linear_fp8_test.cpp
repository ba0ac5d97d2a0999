// The prompt rows' FP8 projections (kernels/cuda/linear_fp8_lt.h) against their CPU twin
// (cpu::linear_fp8_act): cuda::linear_fp8 quantizes the input per row (channel) or per (row, 128
// columns) (block128) and runs cuBLASLt's e4m3 x e4m3 matmul with the file's scales, block128's row
// counts that cuBLASLt refuses padded in scratch; bf16 and fp16, the three outputs (T, fp32, +=
// fp32), the model's shapes and small ones at ragged row counts (1, a tail past a multiple of 128);
// a row's bits the same alone, in its batch and in a batch that starts one row later (the padded
// tail then holds other rows); block128 at 2 k blocks (its scale rows padded to 4) and 3 block rows.
// Skips without a GPU.
#include <cmath>
#include <tuple>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/cuda/linear_fp8_lt.h"
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

}  // namespace
}  // namespace lfm2
