// XXH64 (Yann Collet's xxHash, 64-bit, seed 0 unless given): the digest of every tensor of a weight
// file and of the model fingerprint (io/model_identity.h). Streaming: update() any number of times,
// then digest(); the result equals XXH64 of the concatenated bytes (checked against the reference
// test vectors). About 1 byte per cycle-fraction: several GB/s on one core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lfm2 {

class Xxh64 {
 public:
  Xxh64() : Xxh64(0) {}
  explicit Xxh64(uint64_t seed);
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t seed_, total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

// XXH64 of one buffer.
uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// 16 lowercase hex digits; and back (false on anything else).
std::string hex64(uint64_t v);
bool parse_hex64(const std::string& s, uint64_t* v);

}  // namespace lfm2
