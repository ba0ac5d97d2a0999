// Helpers for the CPU kernel tests: seeded random data and error measures.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace lfm2::test {

inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// max |got - ref| / max |ref| (ref in double).
inline double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double d = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d = std::fmax(d, std::fabs(double(got[i]) - ref[i]));
    m = std::fmax(m, std::fabs(ref[i]));
  }
  return m == 0 ? d : d / m;
}

}  // namespace lfm2::test
