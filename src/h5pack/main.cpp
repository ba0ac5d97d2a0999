// h5pack: writes and examines lfm2-rank weight files (docs/h5pack.md). Thin: parses the command
// line with CLI11 and calls the library; any error becomes one line "h5pack: error: ..." and exit 1.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/cli_checks.h"
#include "common/error.h"
#include "common/log.h"
#include "common/output_guard.h"
#include "common/parallel.h"
#include "common/pending_file.h"
#include "h5pack/convert.h"
#include "h5pack/inspect.h"
#include "h5pack/presets.h"
#include "h5pack/split.h"
#include "h5pack/synth.h"
#include "h5pack/verify.h"
#include "io/h5_util.h"

namespace {

using namespace lfm2;

const std::vector<std::string> kSubcommands = {"convert", "synth", "split", "inspect", "verify"};

// The first argument that is not an option when it names no subcommand: CLI11 would only say that
// it "was not expected".
std::string unknown_subcommand(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-q" || a == "--quiet") continue;
    if (!a.empty() && a[0] == '-') return "";
    for (const auto& s : kSubcommands)
      if (a == s) return "";
    return a;
  }
  return "";
}

// An output path: no directory, in a directory that exists, none of the command's inputs; says when
// it replaces a file.
void check_output(const std::string& what, const std::string& out, const std::vector<NamedPath>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LFM2_CHECK(!fs::is_directory(out, ec), out, ": is a directory (give the output file's path)");
  const fs::path dir = fs::absolute(out).parent_path();
  LFM2_CHECK(fs::is_directory(dir, ec), out, ": cannot write into ", dir.string(), ": no such directory");
  check_output_is_no_input({what, out}, inputs);
  const std::string note = replacing_note(out);
  if (!note.empty()) log_info(note);
}

}  // namespace

int main(int argc, char** argv) {
  h5_no_exit_handlers();
  set_log_prefix("h5pack: ");
  remove_pending_files_on_signals();  // Ctrl-C, a closed pipe: no OUT.h5.tmp.* left behind
  CLI::App app{"h5pack: write and examine lfm2-rank HDF5 weight files"};
  app.require_subcommand(1);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress lines");

  auto* convert = app.add_subcommand("convert", "Hugging Face LFM2-MoE checkpoint directory -> weight file");
  std::string dir, out, dtype_text;
  convert->add_option("DIR", dir, "checkpoint directory (config.json + model.safetensors[.index.json])")
      ->required()
      ->check(cli::path());
  convert->add_option("OUT", out, "output weight file (.h5)")->required()->check(cli::path());
  convert->add_option("--dtype", dtype_text, "stored matrix dtype: fp32|bf16|fp16 (default: the checkpoint's)")
      ->check(cli::one_of({"fp32", "bf16", "fp16"}));

  auto* synth = app.add_subcommand("synth", "seeded random weights at a preset or config shape");
  std::string preset, config_file;
  uint64_t seed = 0;
  int threads = 0;
  synth->add_option("OUT", out, "output weight file (.h5)")->required()->check(cli::path());
  auto* preset_opt = synth->add_option("--preset", preset, "lfm2-8b-a1b | lfm2-mini | lfm2-tiny");
  synth->add_option("--config", config_file, "an HF-style config.json instead of a preset")
      ->excludes(preset_opt)
      ->check(cli::path());
  synth->add_option("--seed", seed, "random seed (default 0)")->check(cli::unsigned64());
  synth->add_option("--dtype", dtype_text, "stored matrix dtype: fp32|bf16|fp16 (default bf16)")
      ->check(cli::one_of({"fp32", "bf16", "fp16"}));
  synth->add_option("--threads", threads, "generator threads (default: all cores); never changes the output")
      ->check(cli::whole(0, kMaxThreads));

  auto* split = app.add_subcommand("split", "one weight file per pipeline stage");
  std::string in, pattern, layers;
  int stages = 0;
  split->add_option("IN", in, "whole-model weight file")->required()->check(cli::path());
  split->add_option("OUT_PATTERN", pattern, "output path with one %d for the stage, e.g. stage-%d.h5")
      ->required()
      ->check(cli::path());
  split->add_option("--stages", stages, "number of stages P (1..layers)")->required()->check(cli::whole(1, 1 << 20));
  split->add_option("--layers", layers, "layers per stage, e.g. 6,6,6,6 (default: balanced by cost)")
      ->check(cli::whole_list(1, 1 << 20));

  auto* inspect = app.add_subcommand("inspect", "config, fingerprint, datasets, parameter count, bytes per stage");
  bool brief = false;
  inspect->add_option("FILE", in, "weight file")->required()->check(cli::path());
  inspect->add_option("--stages", stages, "also report the bytes each of P stages reads")
      ->check(cli::whole(0, 1 << 20));
  inspect->add_flag("--brief", brief, "do not list every dataset");

  auto* verify = app.add_subcommand("verify", "re-read every tensor and check it against the file's digests");
  verify->add_option("FILE", in, "weight or stage file")->required()->check(cli::path());

  const std::string unknown = unknown_subcommand(argc, argv);
  if (!unknown.empty()) {
    log_error(cat("unknown subcommand '", unknown, "' (convert, synth, split, inspect or verify; see h5pack --help)"));
    return 1;
  }
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
      // The checkpoint's own files are checked against OUT inside, once its shards are known.
      check_output("OUT", out, {{"checkpoint directory", dir}});
      convert_checkpoint(dir, out, dtype, !quiet);
      log_info(cat("wrote ", out));
    } else if (synth->parsed()) {
      LFM2_CHECK(!preset.empty() || !config_file.empty(), out, ": synth needs --preset NAME or --config FILE.json");
      check_output("OUT", out, {{"--config file", config_file}});
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
    } else if (verify->parsed()) {
      const VerifyReport r = verify_weights(in, !quiet);
      if (r.nonfinite)
        std::fprintf(stderr, "%swarning: %s: %lld NaN/Inf values, the first in tensor '%s'\n", log_prefix().c_str(),
                     in.c_str(), static_cast<long long>(r.nonfinite), r.first_nonfinite.c_str());
      log_info(cat(in, ": OK: ", r.tensors, " tensors, ", r.bytes, " bytes match their digests; model fingerprint ",
                   r.fingerprint, " (", int64_t(r.seconds * 1000), " ms)"));
    }
  } catch (const std::exception& e) {
    log_error(e.what());
    return 1;
  }
  return 0;
}
