// h5pack: writes and examines lfm2-rank weight files (docs/h5pack.md). Thin: parses the command
// line with CLI11 and calls the library; any error becomes one line "h5pack: error: ..." and exit 1.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "common/pending_file.h"
#include "h5pack/convert.h"
#include "h5pack/inspect.h"
#include "h5pack/presets.h"
#include "h5pack/split.h"
#include "h5pack/synth.h"

int main(int argc, char** argv) {
  using namespace lfm2;
  set_log_prefix("h5pack: ");
  remove_pending_files_on_signals();  // Ctrl-C leaves no OUT.h5.tmp.<pid> behind
  CLI::App app{"h5pack: write and examine lfm2-rank HDF5 weight files"};
  app.require_subcommand(1);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress lines");

  auto* convert = app.add_subcommand("convert", "Hugging Face LFM2-MoE checkpoint directory -> weight file");
  std::string dir, out, dtype_text;
  convert->add_option("DIR", dir, "checkpoint directory (config.json + model.safetensors[.index.json])")->required();
  convert->add_option("OUT", out, "output weight file (.h5)")->required();
  convert->add_option("--dtype", dtype_text, "stored matrix dtype: fp32|bf16|fp16 (default: the checkpoint's)");

  auto* synth = app.add_subcommand("synth", "seeded random weights at a preset or config shape");
  std::string preset, config_file;
  uint64_t seed = 0;
  int threads = 0;
  synth->add_option("OUT", out, "output weight file (.h5)")->required();
  auto* preset_opt = synth->add_option("--preset", preset, "lfm2-8b-a1b | lfm2-mini | lfm2-tiny");
  synth->add_option("--config", config_file, "an HF-style config.json instead of a preset")->excludes(preset_opt);
  synth->add_option("--seed", seed, "random seed (default 0)");
  synth->add_option("--dtype", dtype_text, "stored matrix dtype: fp32|bf16|fp16 (default bf16)");
  synth->add_option("--threads", threads, "generator threads (default: all cores); never changes the output");

  auto* split = app.add_subcommand("split", "one weight file per pipeline stage");
  std::string in, pattern, layers;
  int stages = 0;
  split->add_option("IN", in, "whole-model weight file")->required();
  split->add_option("OUT_PATTERN", pattern, "output path with one %d for the stage, e.g. stage-%d.h5")->required();
  split->add_option("--stages", stages, "number of stages P (1..layers)")->required();
  split->add_option("--layers", layers, "layers per stage, e.g. 6,6,6,6 (default: balanced by cost)");

  auto* inspect = app.add_subcommand("inspect", "config, datasets, parameter count, bytes per stage");
  bool brief = false;
  inspect->add_option("FILE", in, "weight file")->required();
  inspect->add_option("--stages", stages, "also report the bytes each of P stages reads");
  inspect->add_flag("--brief", brief, "do not list every dataset");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    log_error(cat(e.what(), " (see h5pack --help)"));
    return 1;
  }
  try {
    std::optional<DType> dtype;
    if (!dtype_text.empty()) dtype = parse_dtype(dtype_text);
    if (convert->parsed()) {
      convert_checkpoint(dir, out, dtype, !quiet);
      log_info(cat("wrote ", out));
    } else if (synth->parsed()) {
      LFM2_CHECK(!preset.empty() || !config_file.empty(), out, ": synth needs --preset NAME or --config FILE.json");
      const ModelConfig cfg = config_file.empty() ? synth_preset(preset) : ModelConfig::from_file(config_file);
      SynthOptions opt;
      opt.seed = seed;
      opt.dtype = dtype.value_or(DType::BF16);
      opt.threads = threads;
      opt.progress = !quiet;
      synth_weights(cfg, out, opt);
      log_info(cat("wrote ", out));
    } else if (split->parsed()) {
      for (const auto& p : split_weights(in, stages, pattern, layers, !quiet)) log_info(cat("wrote ", p));
    } else if (inspect->parsed()) {
      std::cout << format_report(inspect_weights(in, stages), brief);
    }
  } catch (const std::exception& e) {
    log_error(e.what());
    return 1;
  }
  return 0;
}
