// Fixed-width numbers to and from byte buffers, least significant byte first whatever the host's
// byte order (floating point: their bits): the step plans on the wire (rank/engine/step_plan.h),
// the job hub's results messages (rank/batching/job_hub.h) and the result journal on disk
// (io/result_journal.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace lfm2 {
namespace byte_codec {

// The unsigned integer as wide as T.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 8, uint64_t,
                                std::conditional_t<sizeof(T) == 4, uint32_t,
                                                   std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>>;

}  // namespace byte_codec

template <typename T>
void put_le(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_arithmetic_v<T>, "put_le: numbers only");
  byte_codec::Bits<T> u;
  std::memcpy(&u, &v, sizeof(T));
  for (size_t b = 0; b < sizeof(T); ++b) out.push_back(uint8_t(uint64_t(u) >> (8 * b)));
}

// The T at p (sizeof(T) bytes the caller has checked are there).
template <typename T>
T read_le(const uint8_t* p) {
  static_assert(std::is_arithmetic_v<T>, "read_le: numbers only");
  uint64_t u = 0;
  for (size_t b = 0; b < sizeof(T); ++b) u |= uint64_t(p[b]) << (8 * b);
  const byte_codec::Bits<T> bits = byte_codec::Bits<T>(u);
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// read_le, then p past it.
template <typename T>
T take_le(const uint8_t*& p) {
  const T v = read_le<T>(p);
  p += sizeof(T);
  return v;
}

}  // namespace lfm2
