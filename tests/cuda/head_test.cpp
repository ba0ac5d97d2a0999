// The head's device top-1 and margin (cuda::argmax_margin) against cpu::argmax_margin: random rows
// of several widths (the full vocabulary included), ties, NaN. Exact: both compare the same floats
// and subtract the same two. Skips without a GPU.
#include <cmath>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/argmax.h"
#include "kernels/cuda/ops.h"

namespace lfm2 {
namespace {

using namespace test;

class CudaHead : public CudaTest {
 protected:
  void check(const std::vector<float>& x, int64_t rows, int64_t cols) {
    std::vector<int32_t> ref_top(static_cast<size_t>(rows));
    std::vector<float> ref_margin(static_cast<size_t>(rows));
    cpu::argmax_margin(ref_top.data(), ref_margin.data(), x.data(), rows, cols);
    DevBuf<float> d_x(x.size()), d_margin(ref_margin.size());
    DevBuf<int32_t> d_top(ref_top.size());
    upload(d_x, x);
    cuda::argmax_margin(d_top.get(), d_margin.get(), d_x.get(), rows, cols, stream_);
    sync();
    std::vector<int32_t> top(ref_top.size());
    CUDA_CHECK(cudaMemcpy(top.data(), d_top.get(), top.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    const auto margin = download(d_margin.get(), ref_margin.size());
    EXPECT_EQ(top, ref_top) << rows << " x " << cols;
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isnan(ref_margin[size_t(r)]))
        EXPECT_TRUE(std::isnan(margin[size_t(r)])) << "row " << r;
      else
        EXPECT_EQ(margin[size_t(r)], ref_margin[size_t(r)]) << "row " << r << " of " << rows << " x " << cols;
    }
  }
};

TEST_F(CudaHead, ArgmaxMarginMatchesCpuOnRandomRows) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 1000}, {300, 4097}, {17, 65536}}) {
    auto x = rand_vec(static_cast<size_t>(rows * cols), uint64_t(rows * 31 + cols), 10.f);
    check(x, rows, cols);
  }
}

TEST_F(CudaHead, ArgmaxMarginTiesAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t cols = 3000;
  std::vector<float> x(static_cast<size_t>(4 * cols), -1.f);
  x[10] = x[2500] = 4.f;                // row 0: a tie far apart: the first wins, margin 0
  x[cols + 0] = nan;                    // row 1: NaN first, then a clear maximum
  x[cols + 1999] = 3.f;
  x[cols + 2000] = 2.f;
  for (int64_t j = 0; j < cols; ++j) x[size_t(2 * cols + j)] = nan;  // row 2: all NaN
  for (int64_t j = 0; j < cols; ++j) x[size_t(3 * cols + j)] = float(j % 7);  // row 3: many ties at 6
  check(x, 4, cols);
}

}  // namespace
}  // namespace lfm2
