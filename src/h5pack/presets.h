// Model shapes `h5pack synth` knows by name: the full LFM2-8B-A1B and small models of the same
// family for tests and the shipped default.
#pragma once

#include <string>
#include <vector>

#include "io/model_config.h"

namespace lfm2 {

// "lfm2-8b-a1b": the exact published shape (24 layers, attention at 2, 6, 10, 14, 18, 21, H 2048,
//   V 65536, 32 experts top-4, 8.34 B parameters).
// "lfm2-mini": the same 24-layer layout at H 256 (8 heads / 2 kv heads of 32), V 8192, dense I 768,
//   16 experts top-4 of Im 128 (about 40 M parameters).
// "lfm2-tiny": 6 layers (conv, attention, conv | conv, attention, conv; 2 dense then 4 MoE), H 64,
//   V 512, 8 experts top-2 of Im 32: every layer kind in under 0.5 M parameters.
// Throws lfm2::Error listing the known names for any other.
ModelConfig synth_preset(const std::string& name);
std::vector<std::string> synth_preset_names();

}  // namespace lfm2
