// A portable counter-based random generator: value i of stream (seed, stream) is a pure function of
// (seed, stream, i), so results are bit-identical on every machine, for any thread count and any
// order of generation. Built on splitmix64 (Steele, Lea, Flood 2014), integer arithmetic only.
#pragma once

#include <cstdint>

namespace lfm2 {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream) : key_(splitmix64(splitmix64(seed) ^ splitmix64(~stream))) {}

  // 64 random bits for counter i.
  uint64_t bits(uint64_t i) const { return splitmix64(key_ ^ (i * 0xd1b54a32d192ed03ull)); }

  // An odd integer in [-(2^24 - 1), 2^24 - 1], uniform over those values: value i of a symmetric
  // uniform distribution in units of 2^-24, exact in float and double.
  int32_t symmetric_units(uint64_t i) const { return int32_t(bits(i) >> 40) * 2 - ((1 << 24) - 1); }

  // Uniform in (-1, 1): symmetric_units(i) * 2^-24 (exact).
  double symmetric(uint64_t i) const { return double(symmetric_units(i)) * (1.0 / 16777216.0); }

 private:
  uint64_t key_;
};

}  // namespace lfm2
