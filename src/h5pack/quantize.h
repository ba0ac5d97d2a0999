// `h5pack quantize`: an FP8 weight file from a bf16/fp16/fp32 one (docs/fp8.md). The expert
// matrices (and, with projections, the dense, attention and conv projections) become e4m3 with fp32
// scales per output channel or per 128 x 128 block; every other tensor is copied as it is stored.
#pragma once

#include <string>

#include "common/fp8.h"

namespace lfm2 {

struct QuantizeOptions {
  Fp8Scheme scheme = Fp8Scheme::Channel;
  bool projections = false;  // --dense
  bool progress = false;
  std::string source;  // the output's "source" attribute; empty: "h5pack quantize ... IN"
};

// Writes `out` atomically (a temporary name renamed into place); `in` must be a whole-model file
// that is not FP8 already. The text side travels along; the output's digests are its own.
void quantize_weights(const std::string& in, const std::string& out, const QuantizeOptions& opt);

}  // namespace lfm2
