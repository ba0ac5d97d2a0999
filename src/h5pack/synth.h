// `h5pack synth`: seeded random weights at any model shape, written as a weight file.
//
// Element i of the tensor at dataset path p is offset + scale * u, with u uniform in (-1, 1) taken
// from CounterRng(seed, fnv1a(p)) at counter i (common/rng.h): the file is bit-identical on every
// machine and for any thread count, and a tensor's values depend only on (seed, path, index).
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "io/model_config.h"
#include "io/model_text.h"
#include "io/weight_names.h"

namespace lfm2 {

struct SynthOptions {
  uint64_t seed = 0;
  DType dtype = DType::BF16;  // matrices; vectors are always fp32
  int threads = 0;            // 0: all hardware threads
  bool progress = true;       // progress lines on stdout
  ModelText text;             // a text side to carry (--text DIR: a checkpoint's tokenizer files)
};

// Uniform U(offset - scale, offset + scale) of one tensor, chosen so activations stay sane through
// the layers: linear weights (router and output projections included) std 1/sqrt(fan_in), the
// embedding (and an untied head's fan-in rule) std 1, norms 1 +- 0.1, expert_bias +- 0.05.
struct SynthInit {
  double offset = 0;
  double scale = 0;
};
SynthInit synth_init(const ModelConfig& cfg, const TensorSpec& spec);

// Writes every tensor of the name table to `out` (atomically: temporary name, then rename).
void synth_weights(const ModelConfig& cfg, const std::string& out, const SynthOptions& opt);

// Fills elements [begin, begin + n) of a tensor into `dst` (stored as `dtype`), on `threads` threads.
void synth_fill(void* dst, DType dtype, uint64_t seed, const TensorSpec& spec, const SynthInit& init, uint64_t begin,
                uint64_t n, int threads);

uint64_t fnv1a64(const std::string& s);

}  // namespace lfm2
