// cuda::fp8_dequantize against its CPU twin (kernels/fp8_dequantize.h), bit for bit: random
// matrices quantized under both schemes (128 x 128 blocks with cut edges), stacks of 1-6 matrices,
// columns a multiple of 16 (the 16-byte path) and not (one element a thread), fp32 / bf16 / fp16
// outputs (the twin's fp32 rounded to T: the values the upload's host dequantization gives). Skips
// without a GPU.
#include <cstring>
#include <tuple>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/fp8_dequantize.h"

namespace lfm2 {
namespace {

using namespace test;

template <typename T>
class CudaFp8Dequantize : public CudaTest {};
TYPED_TEST_SUITE(CudaFp8Dequantize, ElemTypes, ElemNames);

TYPED_TEST(CudaFp8Dequantize, MatchesCpuTwinBitForBit) {
  using T = TypeParam;
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 16}, {3, 200, 144}, {2, 130, 129}, {6, 96, 256}, {2, 1792, 2048}};
  for (const auto& [n_mats, rows, cols] : shapes) {
    for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128}) {
      SCOPED_TRACE(cat(n_mats, " x (", rows, ", ", cols, "), ", fp8_scheme_name(scheme)));
      const int64_t per = rows * cols, per_s = fp8_scale_rows(scheme, rows) * fp8_scale_cols(scheme, cols);
      std::vector<float> w = rand_vec(size_t(n_mats * per), 7 + uint64_t(cols), 3.f);
      std::vector<uint8_t> q(w.size());
      std::vector<float> s(size_t(n_mats * per_s));
      for (int64_t m = 0; m < n_mats; ++m) {
        w[size_t(m * per)] *= 50;  // a row or block with a wider range than the others
        fp8_quantize(q.data() + m * per, s.data() + m * per_s, w.data() + m * per, rows, cols, scheme);
      }
      std::vector<float> ref(w.size());
      cpu::fp8_dequantize_mats(ref.data(), q.data(), s.data(), scheme, n_mats, rows, cols);
      const std::vector<T> want = round_to<T>(ref);

      DevBuf<uint8_t> dq(q.size());
      DevBuf<float> ds(s.size());
      DevBuf<T> out(w.size());
      upload(dq, q);
      upload(ds, s);
      cuda::fp8_dequantize<T>(out.get(), dq.get(), ds.get(), scheme, n_mats, rows, cols, this->stream_);
      this->sync();
      std::vector<T> got(w.size());
      CUDA_CHECK(cudaMemcpy(got.data(), out.get(), got.size() * sizeof(T), cudaMemcpyDeviceToHost));
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = int64_t(i);
      EXPECT_EQ(differ, 0) << "first at " << first << ": got " << download(out.get() + first, 1)[0] << ", want "
                           << ref[size_t(first)];
    }
  }
}

}  // namespace
}  // namespace lfm2
