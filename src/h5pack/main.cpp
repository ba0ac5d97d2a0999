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
#include "h5pack/convert_fp8.h"
#include "h5pack/inspect.h"
#include "h5pack/presets.h"
#include "h5pack/quantize.h"
#include "h5pack/split.h"
#include "h5pack/synth.h"
#include "h5pack/verify.h"
#include "io/h5_util.h"
#include "io/model_text.h"
#include "lfm2/build_info.h"

namespace {

using namespace lfm2;

const std::vector<std::string> kSubcommands = {"convert", "synth", "quantize", "split", "inspect", "verify"};

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

// The text side of a checkpoint directory for `synth --text DIR`, checked as convert checks it.
ModelText checked_text_side(const std::string& dir, const ModelConfig& cfg, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LFM2_CHECK(fs::is_directory(dir, ec), "--text ", dir, ": not a directory (give a checkpoint directory)");
  std::vector<NamedPath> inputs;
  for (const auto& name : text_file_names()) inputs.push_back({"--text file", (fs::path(dir) / name).string()});
  check_output_is_no_input({"OUT", out}, inputs);
  ModelText text = read_text_files(dir);
  LFM2_CHECK(!text.empty(), "--text ", dir, ": holds none of tokenizer.json, tokenizer_config.json, "
             "special_tokens_map.json, generation_config.json, chat_template.jinja");
  try {
    for (const auto& w : check_model_text(text, cfg.vocab_size))
      std::fprintf(stderr, "%swarning: %s/%s\n", log_prefix().c_str(), dir.c_str(), w.c_str());
  } catch (const Error& e) {
    throw Error(cat((fs::path(dir) / "").string(), e.what()));
  }
  return text;
}

// --version: this build and what it was built with (cmake/BuildInfo.cmake), and the HDF5 library it
// runs with (a shared library may differ from the headers).
std::string version_text() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return cat("h5pack ", LFM2_VERSION, " (lfm2-rank ", LFM2_VERSION, ", commit ", LFM2_COMMIT, ", ", LFM2_BUILD_TYPE,
             ")\nbuilt with: CUDA ", LFM2_CUDA_VERSION, ", NCCL ", LFM2_NCCL_VERSION, ", ", LFM2_MPI_VERSION,
             ", HDF5 ", LFM2_HDF5_VERSION, " (running ", major, ".", minor, ".", release, "), ", LFM2_COMPILER);
}

// Every subcommand's arguments, as CLI11 parses them, and the subcommands.
struct Args {
  bool quiet = false, brief = false, fp8 = false, dense = false;
  std::string dir, out, dtype_text, preset, config_file, text_dir, in, pattern, layers, scheme = "channel";
  uint64_t seed = 0;
  int threads = 0, stages = 0;
  CLI::App *convert = nullptr, *synth = nullptr, *quantize = nullptr, *split = nullptr, *inspect = nullptr,
           *verify = nullptr;
  CLI::Option *convert_scheme = nullptr, *convert_dense = nullptr;
};

// convert and synth: weight files from a checkpoint or from a seed.
void add_writers(CLI::App& app, Args& a) {
  a.convert = app.add_subcommand("convert", "Hugging Face LFM2-MoE checkpoint directory -> weight file");
  a.convert->add_option("DIR", a.dir, "checkpoint directory (config.json + model.safetensors[.index.json])")
      ->required()
      ->check(cli::path());
  a.convert->add_option("OUT", a.out, "output weight file (.h5)")->required()->check(cli::path());
  a.convert->add_option("--dtype", a.dtype_text,
                        "stored matrix dtype: fp32|bf16|fp16|fp8 (default: the checkpoint's; fp8: = convert, then "
                        "quantize --fp8, through a temporary file beside OUT)")
      ->check(cli::one_of({"fp32", "bf16", "fp16", "fp8"}));
  a.convert_scheme = a.convert->add_option("--scheme", a.scheme, "with --dtype fp8: as quantize --scheme (default channel)")
                         ->check(cli::one_of({"channel", "block128"}));
  a.convert_dense = a.convert->add_flag("--dense", a.dense, "with --dtype fp8: as quantize --dense");

  a.synth = app.add_subcommand("synth", "seeded random weights at a preset or config shape");
  a.synth->add_option("OUT", a.out, "output weight file (.h5)")->required()->check(cli::path());
  auto* preset_opt = a.synth->add_option("--preset", a.preset, "lfm2-8b-a1b | lfm2-mini | lfm2-tiny");
  a.synth->add_option("--config", a.config_file, "an HF-style config.json instead of a preset")
      ->excludes(preset_opt)
      ->check(cli::path());
  a.synth->add_option("--seed", a.seed, "random seed (default 0)")->check(cli::unsigned64());
  a.synth->add_option("--dtype", a.dtype_text, "stored matrix dtype: fp32|bf16|fp16 (default bf16)")
      ->check(cli::one_of({"fp32", "bf16", "fp16"}));
  a.synth->add_option("--threads", a.threads, "generator threads (default: all cores); never changes the output")
      ->check(cli::whole(0, kMaxThreads));
  a.synth->add_option("--text", a.text_dir,
                      "carry the text side (tokenizer.json, tokenizer_config.json, generation_config.json, ...) of "
                      "this checkpoint directory")
      ->check(cli::path());
}

// split, inspect and verify: what is done with a weight file.
void add_readers(CLI::App& app, Args& a) {
  a.quantize = app.add_subcommand("quantize", "FP8 weights: e4m3 experts (--dense: and projections), fp32 scales");
  a.quantize->add_option("IN", a.in, "whole-model weight file (bf16, fp16 or fp32)")->required()->check(cli::path());
  a.quantize->add_option("OUT", a.out, "output weight file (.h5)")->required()->check(cli::path());
  a.quantize->add_flag("--fp8", a.fp8, "quantize to FP8 e4m3 (the only format; required)")->required();
  a.quantize->add_option("--scheme", a.scheme, "scales per output channel or per 128x128 block (default channel)")
      ->check(cli::one_of({"channel", "block128"}));
  a.quantize->add_flag("--dense", a.dense, "also the dense MLP, attention q/k/v/o and conv in/out projections");

  a.split = app.add_subcommand("split", "one weight file per pipeline stage");
  a.split->add_option("IN", a.in, "whole-model weight file")->required()->check(cli::path());
  a.split->add_option("OUT_PATTERN", a.pattern, "output path with one %d for the stage, e.g. stage-%d.h5")
      ->required()
      ->check(cli::path());
  a.split->add_option("--stages", a.stages, "number of stages P (1..layers)")->required()->check(cli::whole(1, 1 << 20));
  a.split->add_option("--layers", a.layers, "layers per stage, e.g. 6,6,6,6 (default: balanced by cost)")
      ->check(cli::whole_list(1, 1 << 20));

  a.inspect = app.add_subcommand("inspect", "config, fingerprint, datasets, parameter count, bytes per stage");
  a.inspect->add_option("FILE", a.in, "weight file")->required()->check(cli::path());
  a.inspect->add_option("--stages", a.stages, "also report the bytes each of P stages reads")
      ->check(cli::whole(0, 1 << 20));
  a.inspect->add_flag("--brief", a.brief, "do not list every dataset");

  a.verify = app.add_subcommand("verify", "re-read every tensor and check it against the file's digests");
  a.verify->add_option("FILE", a.in, "weight or stage file")->required()->check(cli::path());
}

QuantizeOptions quantize_options(const Args& a) {
  QuantizeOptions opt;
  opt.scheme = parse_fp8_scheme(a.scheme);
  opt.projections = a.dense;
  opt.progress = !a.quiet;
  return opt;
}

void run_convert(const Args& a) {
  // The checkpoint's own files are checked against OUT inside, once its shards are known.
  check_output("OUT", a.out, {{"checkpoint directory", a.dir}});
  const bool scheme_given = a.convert_scheme->count() > 0 || a.convert_dense->count() > 0;
  if (a.dtype_text == "fp8") {
    convert_checkpoint_fp8(a.dir, a.out, quantize_options(a), scheme_given);
  } else {
    LFM2_CHECK(!scheme_given, a.out, ": --scheme and --dense go with --dtype fp8");
    std::optional<DType> dtype;
    if (!a.dtype_text.empty()) dtype = parse_dtype(a.dtype_text);
    convert_checkpoint(a.dir, a.out, dtype, !a.quiet);
  }
  log_info(cat("wrote ", a.out));
}

void run_synth(const Args& a, const std::optional<DType>& dtype) {
  LFM2_CHECK(!a.preset.empty() || !a.config_file.empty(), a.out, ": synth needs --preset NAME or --config FILE.json");
  check_output("OUT", a.out, {{"--config file", a.config_file}});
  const ModelConfig cfg = a.config_file.empty() ? synth_preset(a.preset) : ModelConfig::from_file(a.config_file);
  SynthOptions opt;
  opt.seed = a.seed;
  opt.dtype = dtype.value_or(DType::BF16);
  opt.threads = a.threads;
  opt.progress = !a.quiet;
  if (!a.text_dir.empty()) opt.text = checked_text_side(a.text_dir, cfg, a.out);
  synth_weights(cfg, a.out, opt);
  log_info(cat("wrote ", a.out));
}

void run_quantize(const Args& a) {
  check_output("OUT", a.out, {{"IN", a.in}});
  quantize_weights(a.in, a.out, quantize_options(a));
  log_info(cat("wrote ", a.out));
}

void run_verify(const Args& a) {
  const VerifyReport r = verify_weights(a.in, !a.quiet);
  if (r.nonfinite)
    std::fprintf(stderr, "%swarning: %s: %lld NaN/Inf values, the first in tensor '%s'\n", log_prefix().c_str(),
                 a.in.c_str(), static_cast<long long>(r.nonfinite), r.first_nonfinite.c_str());
  const std::string text = r.text_files ? cat("; ", r.text_files, " text files match their digests, text fingerprint ",
                                              r.text_fingerprint)
                                        : std::string("; no text side");
  log_info(cat(a.in, ": OK: ", r.tensors, " tensors, ", r.bytes, " bytes match their digests; model fingerprint ",
               r.fingerprint, text, " (", int64_t(r.seconds * 1000), " ms)"));
}

// The parsed subcommand; throws on any error.
void run(const Args& a) {
  if (a.convert->parsed()) {
    run_convert(a);
  } else if (a.synth->parsed()) {
    std::optional<DType> dtype;
    if (!a.dtype_text.empty()) dtype = parse_dtype(a.dtype_text);
    run_synth(a, dtype);
  } else if (a.quantize->parsed()) {
    run_quantize(a);
  } else if (a.split->parsed()) {
    for (const auto& p : split_weights(a.in, a.stages, a.pattern, a.layers, !a.quiet)) log_info(cat("wrote ", p));
  } else if (a.inspect->parsed()) {
    std::cout << format_report(inspect_weights(a.in, a.stages), a.brief);
  } else if (a.verify->parsed()) {
    run_verify(a);
  }
}

}  // namespace

int main(int argc, char** argv) {
  h5_no_exit_handlers();
  set_log_prefix("h5pack: ");
  remove_pending_files_on_signals();  // Ctrl-C, a closed pipe: no OUT.h5.tmp.* left behind
  CLI::App app{"h5pack: write and examine lfm2-rank HDF5 weight files"};
  app.require_subcommand(1);
  Args a;
  app.add_flag("-q,--quiet", a.quiet, "no progress lines");
  app.set_version_flag("--version", version_text(), "version, commit, and the CUDA / NCCL / MPI / HDF5 of the build");
  add_writers(app, a);
  add_readers(app, a);
  const std::string unknown = unknown_subcommand(argc, argv);
  if (!unknown.empty()) {
    log_error(cat("unknown subcommand '", unknown, "' (convert, synth, quantize, split, inspect or verify; see h5pack --help)"));
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
    run(a);
  } catch (const std::exception& e) {
    log_error(e.what());
    return 1;
  }
  return 0;
}
