// The FP8 grouped GEMM for prefill (kernels/cuda/grouped_gemm_fp8.h) against its CPU twins
// (kernels/moe_grouped_fp8.h): the e4m3 quantization of expert-ordered bf16 / fp16 rows (bits and
// scales equal, a zero group included) and the CUTLASS product with 128 x 128 block-scaled e4m3
// experts (bf16 out at bf16's tolerance), on ragged groups with an empty expert and at the model's
// widths. Skips without a GPU.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/fp8.h"
#include "cuda_test_util.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/moe_grouped_fp8.h"

namespace lfm2 {
namespace {

using namespace test;

// Expert e's weights (n_out, n_in) quantized by 128 x 128 blocks; the scales transposed per
// expert to (n_in / 128, n_out / 128), the layout the GPU kernel reads.
struct Experts {
  std::vector<uint8_t> q;
  std::vector<float> s_kn;
};

Experts make_experts(int64_t E, int64_t n_out, int64_t n_in, uint64_t seed) {
  const auto w = rand_vec(size_t(E * n_out * n_in), seed, 0.05f);
  const int64_t NB = n_out / 128, KB = n_in / 128;
  Experts x{std::vector<uint8_t>(w.size()), std::vector<float>(size_t(E * NB * KB))};
  std::vector<float> s(size_t(NB * KB));
  for (int64_t e = 0; e < E; ++e) {
    fp8_quantize(x.q.data() + e * n_out * n_in, s.data(), w.data() + e * n_out * n_in, n_out, n_in,
                 Fp8Scheme::Block128);
    for (int64_t nb = 0; nb < NB; ++nb)
      for (int64_t kb = 0; kb < KB; ++kb) x.s_kn[size_t(e * NB * KB + kb * NB + nb)] = s[size_t(nb * KB + kb)];
  }
  return x;
}

std::vector<uint8_t> byte_download(const uint8_t* d, size_t n) {
  std::vector<uint8_t> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
  return h;
}

template <typename T>
class CudaFp8Grouped : public CudaTest {};
using HalfTypes = ::testing::Types<__nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaFp8Grouped, HalfTypes, ElemNames);

TYPED_TEST(CudaFp8Grouped, QuantizeMatchesCpu) {
  using T = TypeParam;
  const std::vector<int32_t> offsets = {0, 70, 70, 181, 250, 300};  // expert 1 empty
  const int64_t E = int64_t(offsets.size()) - 1, rows = offsets.back(), cols = 384;
  auto x = rand_vec(size_t(rows * cols), 5, 3.f);
  std::fill(x.begin() + 75 * cols + 128, x.begin() + 75 * cols + 256, 0.f);  // a zero group: scale 1
  x[size_t(9 * cols + 3)] = 1e4f;                                             // a large one: 448 exactly
  const auto raw = round_to<T>(x);
  DevBuf<T> d_x(raw.size());
  DevBuf<int32_t> d_off(offsets.size());
  DevBuf<uint8_t> d_q(size_t(rows * cols));
  DevBuf<float> d_s(size_t(rows * cols / 128));
  upload(d_x, raw);
  upload(d_off, offsets);
  cuda::moe_quantize_e4m3(d_q.get(), d_s.get(), d_x.get(), d_off.get(), rows, E, cols, this->stream_);
  this->sync();
  std::vector<uint8_t> q(size_t(rows * cols));
  std::vector<float> s(size_t(rows * cols / 128));
  cpu::moe_quantize_e4m3(q.data(), s.data(), x.data(), offsets.data(), rows, E, cols);
  EXPECT_EQ(byte_download(d_q.get(), q.size()), q);
  EXPECT_EQ(download(d_s.get(), s.size()), s);
}

// The products at a ragged small shape and at the model's widths (gate/up 2048 -> 2 x 1792 cut to 512
// columns to keep the CPU reference quick; down 1792 -> 2048).
TYPED_TEST(CudaFp8Grouped, ProductMatchesCpu) {
  using T = TypeParam;
  struct Case {
    std::vector<int32_t> offsets;
    int64_t n_in, n_out;
  };
  const std::vector<Case> cases = {{{0, 70, 70, 181, 250, 300}, 256, 384},
                                   {{0, 1, 65, 200, 260}, 2048, 512},
                                   {{0, 130, 131, 256}, 1792, 2048}};
  for (const Case& c : cases) {
    const int64_t E = int64_t(c.offsets.size()) - 1, rows = c.offsets.back();
    auto x = rand_vec(size_t(rows * c.n_in), 7, 2.f);
    const auto raw = round_to<T>(x);
    const Experts w = make_experts(E, c.n_out, c.n_in, 8);
    DevBuf<T> d_x(raw.size());
    DevBuf<int32_t> d_off(c.offsets.size());
    DevBuf<uint8_t> d_q(size_t(rows * c.n_in)), d_w(w.q.size());
    DevBuf<float> d_sa(size_t(rows * c.n_in / 128)), d_sw(w.s_kn.size());
    DevBuf<__nv_bfloat16> d_out(size_t(rows * c.n_out));
    DevBuf<char> ws(size_t(cuda::moe_grouped_matmul_fp8_workspace_bytes(E)));
    upload(d_x, raw);
    upload(d_off, c.offsets);
    upload(d_w, w.q);
    upload(d_sw, w.s_kn);
    cuda::moe_quantize_e4m3(d_q.get(), d_sa.get(), d_x.get(), d_off.get(), rows, E, c.n_in, this->stream_);
    cuda::moe_grouped_matmul_fp8(d_out.get(), d_q.get(), d_sa.get(), d_w.get(), d_sw.get(), d_off.get(), rows, E,
                                 c.n_in, c.n_out, ws.get(), this->stream_);
    this->sync();
    std::vector<uint8_t> q(size_t(rows * c.n_in));
    std::vector<float> sa(size_t(rows * c.n_in / 128)), want(size_t(rows * c.n_out));
    cpu::moe_quantize_e4m3(q.data(), sa.data(), x.data(), c.offsets.data(), rows, E, c.n_in);
    cpu::moe_grouped_matmul_fp8(want.data(), q.data(), sa.data(), w.q.data(), w.s_kn.data(), c.offsets.data(), E,
                                c.n_in, c.n_out);
    EXPECT_TRUE(close_t<__nv_bfloat16>(download(d_out.get(), want.size()), want))
        << E << " experts, " << rows << " rows, " << c.n_in << " -> " << c.n_out;
  }
}

}  // namespace
}  // namespace lfm2
