// `h5pack verify FILE`: re-reads every tensor of a weight or stage file and checks it against the
// digest the file records (io/model_identity.h), the digests against the model fingerprint, and the
// file's datasets against the name table (a whole-model file holds every tensor, a stage file
// exactly its stage's, each of the right shape and dtype). Non-finite values are counted and
// reported, not failed (an fp16 conversion may make +-inf on purpose). The text side (tokenizer,
// chat template, generation defaults: io/model_text.h), when the file has one, is checked against
// its digests and text fingerprint too.
#pragma once

#include <cstdint>
#include <string>

namespace lfm2 {

struct VerifyReport {
  std::string fingerprint;  // 16 hex digits
  int64_t tensors = 0, bytes = 0;
  int64_t nonfinite = 0;          // NaN / +-Inf values in all tensors
  std::string first_nonfinite;    // the first tensor holding one
  double seconds = 0;
  int64_t text_files = 0;        // text-side files checked
  std::string text_fingerprint;  // 16 hex digits, "" without a text side
};

// Throws lfm2::Error naming the file and the first problem: a tensor whose bytes do not match its
// digest, a missing or extra dataset, a file without digests (an older h5pack), a damaged header.
VerifyReport verify_weights(const std::string& path, bool progress);

}  // namespace lfm2
