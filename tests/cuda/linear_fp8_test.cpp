// The prompt rows' FP8 projections (kernels/cuda/linear_fp8_lt.h) against their CPU twin
// (cpu::linear_fp8_act): the input quantized per row (channel) or per (row, 128 columns) (block128)
// by quantize_rows_fp8_lt, cuBLASLt's e4m3 x e4m3 matmul with the file's scales; bf16 and fp16, the
// three outputs (T, fp32, += fp32), ragged row counts incl. 1 and the model's shapes (channel; row 0
// alone gives the bits it has in its batch), block128 at 4,096 rows. Skips without a GPU.
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/cuda/linear_fp8_lt.h"
#include "kernels/fp8_products.h"

namespace lfm2 {
namespace {

using namespace test;

template <typename T>
class CudaLinearFp8 : public CudaTest {};
using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaLinearFp8, HalfTypes, ElemNames);

TYPED_TEST(CudaLinearFp8, MatchesCpuTwin) {
  using T = TypeParam;
  // (rows, n_in, n_out): the full model's qkv, out / conv out, conv in, dense w13, w2, and small ones
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 2048, 3072}, {7, 2048, 2048}, {33, 2048, 6144}, {200, 2048, 14336}, {129, 7168, 2048},
      {5, 256, 384},   {64, 128, 128},  {300, 512, 1536}};
  // block128 at the plan's 4,096 rows only: cuBLASLt (CUDA 13.0, H100) refuses its block-scaled FP8
  // matmul for 1 row and some ragged counts (DN8 call 2), so its row-count invariance is not tested
  std::vector<std::tuple<int64_t, int64_t, int64_t, Fp8Scheme>> cases;
  for (const auto& [n, K, N] : shapes) cases.emplace_back(n, K, N, Fp8Scheme::Channel);
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{256, 384}, {2048, 512}, {512, 2048}})
    cases.emplace_back(4096, K, N, Fp8Scheme::Block128);
  for (const auto& [n, K, N, scheme] : cases) {
    {
      SCOPED_TRACE(cat(n, " rows, ", K, " -> ", N, ", ", fp8_scheme_name(scheme)));
      const auto wf = rand_vec(size_t(N * K), 70 + uint64_t(K + N), float(1 / std::sqrt(double(K))));
      std::vector<uint8_t> wq(wf.size());
      std::vector<float> ws(size_t(fp8_scale_rows(scheme, N) * fp8_scale_cols(scheme, K)));
      fp8_quantize(wq.data(), ws.data(), wf.data(), N, K, scheme);
      auto in = rand_vec(size_t(n * K), 71 + uint64_t(n));
      const auto in_t = round_to<T>(in);  // in now holds the T values
      std::vector<float> ref(size_t(n * N));
      cpu::linear_fp8_act(ref.data(), in.data(), wq.data(), ws.data(), scheme, n, K, N, 8);
      DevBuf<T> d_in(in_t.size()), d_out_t(ref.size());
      DevBuf<uint8_t> d_w(wq.size()), d_q(in.size());
      DevBuf<float> d_ws(ws.size()), d_qs(size_t(n * (K / 128))), d_out(ref.size());
      DevBuf<int32_t> d_off(4);
      upload(d_in, in_t);
      upload(d_w, wq);
      upload(d_ws, ws);
      auto run = [&](void* out, cuda::LtOut kind, int64_t rows) {
        cuda::quantize_rows_fp8_lt<T>(d_q.get(), d_qs.get(), d_off.get(), d_in.get(), scheme, rows, K, this->stream_);
        cuda::linear_fp8_lt<T>(out, kind, d_q.get(), d_qs.get(), d_w.get(), d_ws.get(), scheme, rows, K, N,
                               this->stream_);
        this->sync();
      };
      run(d_out.get(), cuda::LtOut::kF32, n);
      const auto got = download(d_out.get(), ref.size());
      EXPECT_TRUE(close_t<T>(got, ref));
      // row 0 alone: the bits of its batch (the pinned algorithm, its own scales)
      if (scheme == Fp8Scheme::Channel) {
        run(d_out.get(), cuda::LtOut::kF32, 1);
        EXPECT_TRUE(same_bits(download(d_out.get(), size_t(N)), std::vector<float>(got.begin(), got.begin() + N)));
      }
      // += into an fp32 residual, and T out
      const auto x0 = rand_vec(ref.size(), 72);
      upload(d_out, x0);
      run(d_out.get(), cuda::LtOut::kAddF32, n);
      std::vector<float> sum(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) sum[i] = x0[i] + ref[i];
      EXPECT_TRUE(close_t<T>(download(d_out.get(), ref.size()), sum));
      run(d_out_t.get(), cuda::LtOut::kT, n);
      EXPECT_TRUE(close_t<T>(download(d_out_t.get(), ref.size()), ref));
    }
  }
}

}  // namespace
}  // namespace lfm2
