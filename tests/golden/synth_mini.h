// Test weights: the lfm2-mini preset cut to its first n_layers layers, synthesised (fp32, seeded)
// into the golden tests' work directory.
#pragma once

#include <filesystem>
#include <string>

#include "h5pack/presets.h"
#include "h5pack/synth.h"

namespace lfm2::test {

// Writes LFM2_GOLDEN_WORK_DIR/name and returns its path; *cfg gets the config.
inline std::string synth_mini(int n_layers, uint64_t seed, const std::string& name, ModelConfig* cfg) {
  *cfg = synth_preset("lfm2-mini");
  cfg->num_hidden_layers = n_layers;
  cfg->layer_types.resize(size_t(n_layers));
  cfg->validate("test config");
  const std::string path = std::string(LFM2_GOLDEN_WORK_DIR) + "/" + name;
  std::filesystem::create_directories(LFM2_GOLDEN_WORK_DIR);
  SynthOptions opt;
  opt.seed = seed;
  opt.dtype = DType::F32;
  opt.progress = false;
  synth_weights(*cfg, path, opt);
  return path;
}

}  // namespace lfm2::test
