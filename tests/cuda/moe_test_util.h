// Shared helpers of the decode-product tests (decode_gemm_test.cpp, moe_decode_test.cpp): bit
// equality of results, the routings of the MoE tests, random expert weights rounded to the element
// type (on the host and the device) and the CPU reference of the routed experts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/add.h"
#include "kernels/moe_experts.h"

namespace lfm2::test {

// Bit equality of two float vectors, naming the first difference and how many there are.
inline ::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t n_diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && n_diff++ == 0) first = i;
  if (n_diff == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << n_diff << " of " << got.size() << " differ; first at " << first << ": "
                                       << got[first] << " vs " << want[first];
}

// Routings of the MoE tests: spread (distinct experts per token, every expert used), few (only
// experts 1 and E-2 have rows), one (every token's first pick is E/2: one expert holds all tokens),
// random (a hash of the token: uneven counts).
enum class Routing { kSpread, kFew, kOne, kRandom };

inline void make_routing(std::vector<int32_t>& experts, std::vector<float>& weights, int64_t n, int64_t E,
                         int64_t k, Routing routing, uint64_t seed) {
  experts.assign(static_cast<size_t>(n * k), 0);
  weights.assign(experts.size(), 0.f);
  CounterRng rng(77, seed);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> picked;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = 0;
      switch (routing) {
        case Routing::kSpread: e = int32_t((t * 5 + j * (E / k + 1) + (t % 3)) % E); break;
        case Routing::kFew: e = int32_t(j == 0 ? ((t % 2) ? 1 : E - 2) : ((t % 2) ? E - 2 : 1)); break;
        case Routing::kOne: e = int32_t((E / 2 + j * (1 + t % (E / k))) % E); break;
        case Routing::kRandom: {
          uint64_t i = uint64_t(t * 64 + j);
          do e = int32_t(rng.bits(i++) % uint64_t(E));
          while (std::find(picked.begin(), picked.end(), e) != picked.end());
          break;
        }
      }
      picked.push_back(e);
      experts[size_t(t * k + j)] = e;
      weights[size_t(t * k + j)] = 0.1f + 0.2f * float((t + j) % 5) + float(rng.symmetric(uint64_t(t * 64 + j))) * 0.05f;
    }
  }
}

// Random MoE weights rounded to T: w13 (E, 2I, H) as uploaded (each expert's w1 rows then its w3
// rows), w1, w3 split out of it for the CPU, w2 (E, H, I).
struct MoeWeights {
  std::vector<float> w1, w3, w13, w2;
};

template <typename T>
MoeWeights moe_weights(int64_t H, int64_t E, int64_t I, uint64_t seed) {
  MoeWeights w;
  w.w13 = rand_vec(static_cast<size_t>(E * 2 * I * H), seed, float(1 / std::sqrt(double(H))));
  w.w2 = rand_vec(static_cast<size_t>(E * H * I), seed + 1, float(1 / std::sqrt(double(I))));
  round_to<T>(w.w13);
  round_to<T>(w.w2);
  w.w1.resize(static_cast<size_t>(E * I * H));
  w.w3.resize(w.w1.size());
  for (int64_t e = 0; e < E; ++e) {
    std::copy_n(w.w13.begin() + e * 2 * I * H, I * H, w.w1.begin() + e * I * H);
    std::copy_n(w.w13.begin() + e * 2 * I * H + I * H, I * H, w.w3.begin() + e * I * H);
  }
  return w;
}

// The weights on the device.
template <typename T>
struct DevMoe {
  DevBuf<T> w13, w2;
  DevMoe(const MoeWeights& w) : w13(w.w13.size()), w2(w.w2.size()) {
    std::vector<float> a = w.w13, b = w.w2;
    upload(w13, round_to<T>(a));
    upload(w2, round_to<T>(b));
  }
};

// x + cpu::moe_experts(in) (8 threads).
inline std::vector<float> moe_reference(const std::vector<float>& x, const std::vector<float>& in,
                                        const MoeWeights& w, const std::vector<int32_t>& experts,
                                        const std::vector<float>& weights, int64_t n, int64_t H, int64_t E, int64_t I,
                                        int64_t k) {
  const auto need = cpu::moe_experts_scratch(n, H, E, I, k, 8);
  std::vector<float> fs(static_cast<size_t>(need.floats)), moe(static_cast<size_t>(n * H)), ref(moe.size());
  std::vector<int32_t> is(static_cast<size_t>(need.ints));
  cpu::moe_experts(moe.data(), in.data(), w.w1.data(), w.w3.data(), w.w2.data(), experts.data(), weights.data(), n, H,
                   E, I, k, fs.data(), is.data(), 8);
  cpu::add(ref.data(), x.data(), moe.data(), n * H);
  return ref;
}

}  // namespace lfm2::test
