#include "common/xxhash64.h"

#include <cstring>

namespace lfm2 {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                   kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts (x86-64, aarch64): the reference's byte order
  return v;
}
inline uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round(uint64_t acc, uint64_t input) { return rotl(acc + input * kP2, 31) * kP1; }
inline uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round(0, v)) * kP1 + kP4; }

}  // namespace

Xxh64::Xxh64(uint64_t seed) : v_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed) {}

void Xxh64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_ + n < 32) {
    if (n) std::memcpy(buf_ + buffered_, p, n);
    buffered_ += n;
    return;
  }
  if (buffered_) {
    const size_t take = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, take);
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], read64(buf_ + 8 * i));
    p += take;
    n -= take;
    buffered_ = 0;
  }
  uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
  for (; n >= 32; p += 32, n -= 32) {
    a = round(a, read64(p));
    b = round(b, read64(p + 8));
    c = round(c, read64(p + 16));
    d = round(d, read64(p + 24));
  }
  v_[0] = a, v_[1] = b, v_[2] = c, v_[3] = d;
  if (n) std::memcpy(buf_, p, n);
  buffered_ = n;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, v_[i]);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, read64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = rotl(h ^ (uint64_t(read32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t n, uint64_t seed) {
  Xxh64 h(seed);
  h.update(data, n);
  return h.digest();
}

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = digits[v & 15];
  return s;
}

bool parse_hex64(const std::string& s, uint64_t* v) {
  if (s.size() != 16) return false;
  uint64_t r = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    r = r << 4 | uint64_t(d);
  }
  *v = r;
  return true;
}

}  // namespace lfm2
