// Shared helpers of the CUDA tests: a fixture that skips without a GPU and owns a stream, device
// buffers, seeded random data rounded to the element type under test, and the dtype tolerance check
// |got - ref| <= atol + rtol * |ref|.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "common/dtype.h"
#include "common/rng.h"

namespace lfm2::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }
  void sync() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  cudaStream_t stream_ = nullptr;
};

// Element-type traits for the tests: the DType and the tolerance of a result rounded to it.
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr DType kType = DType::F32;
  static constexpr double kAtol = 1e-5, kRtol = 1e-4;
};
template <>
struct Elem<__nv_bfloat16> {
  static constexpr DType kType = DType::BF16;
  static constexpr double kAtol = 1e-2, kRtol = 1.6e-2;
};
template <>
struct Elem<__half> {
  static constexpr DType kType = DType::F16;
  static constexpr double kAtol = 2e-3, kRtol = 2e-3;
};

// A device buffer of n elements of type E, poisoned with 0xff bytes (NaN for floats) so that an
// element no kernel wrote shows up. Host copies here run on the legacy stream and are finished
// (device-synchronised) before returning, since the fixture's stream does not wait for them.
template <typename E>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(E)));
    CUDA_CHECK(cudaMemset(p_, 0xff, std::max<size_t>(n, 1) * sizeof(E)));
    CUDA_CHECK(cudaDeviceSynchronize());  // the tests' stream is non-blocking: finish the poison first
  }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  E* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  E* p_ = nullptr;
  size_t n_ = 0;
};

// n values uniform in (-scale, scale) from stream `seed`.
inline std::vector<float> rand_vec(size_t n, uint64_t seed, float scale = 1.f) {
  CounterRng rng(1234, seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(rng.symmetric(i)) * scale;
  return v;
}

// Rounds v to T's precision in place (what the device will see) and returns the raw T values.
template <typename T>
std::vector<T> round_to(std::vector<float>& v) {
  std::vector<T> raw(v.size());
  convert_elements(raw.data(), Elem<T>::kType, v.data(), DType::F32, v.size());
  convert_elements(v.data(), DType::F32, raw.data(), Elem<T>::kType, v.size());
  return raw;
}

template <typename E>
void upload(DevBuf<E>& d, const std::vector<E>& h) {
  ASSERT_LE(h.size(), d.size());
  CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before its DMA lands
}

// Device int32 values, as they are.
inline std::vector<int32_t> int_download(const int32_t* d, size_t n) {
  std::vector<int32_t> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return h;
}

inline std::vector<uint8_t> byte_download(const uint8_t* d, size_t n) {
  std::vector<uint8_t> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
  return h;
}

// Device values of type T as floats.
template <typename T>
std::vector<float> download(const T* d, size_t n) {
  std::vector<T> raw(n);
  CUDA_CHECK(cudaMemcpy(raw.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  if constexpr (std::is_same<T, float>::value)
    out = raw;
  else
    convert_elements(out.data(), DType::F32, raw.data(), Elem<T>::kType, n);
  return out;
}

// Checks every element; reports the worst one relative to its tolerance.
inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                                        double rtol) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  double worst = 0, max_abs = 0;
  size_t wi = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!std::isfinite(got[i]) || !(d <= atol + rtol * std::fabs(double(ref[i]))))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << ref[i]
                                           << " (atol " << atol << ", rtol " << rtol << ")";
    const double r = d / (atol + rtol * std::fabs(double(ref[i])));
    max_abs = std::max(max_abs, d);
    if (r > worst) worst = r, wi = i;
  }
  return ::testing::AssertionSuccess() << "max |err| " << max_abs << ", worst " << worst << " of tolerance at " << wi;
}

template <typename T>
::testing::AssertionResult close_t(const std::vector<float>& got, const std::vector<float>& ref, double scale = 1) {
  return close(got, ref, Elem<T>::kAtol * scale, Elem<T>::kRtol);
}

using ElemTypes = ::testing::Types<float, __nv_bfloat16, __half>;

struct ElemNames {
  template <typename T>
  static std::string GetName(int) {
    return std::string(dtype_name(Elem<T>::kType));
  }
};

}  // namespace lfm2::test
