#include "rank/startup/shipped_default.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace lfm2 {
namespace {

namespace fs = std::filesystem;

// ./data/default, else the installed P/share/lfm2-rank/data/default beside this program, else the
// source tree's.
std::string default_dir() {
  if (fs::exists("data/default/recipe.json")) return "data/default";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = (exe.parent_path() / ".." / "share" / "lfm2-rank" / "data" / "default").lexically_normal();
    if (fs::exists(installed / "recipe.json", ec)) return installed.string();
  }
  return std::string(LFM2_SOURCE_DIR) + "/data/default";
}

// ${LFM2_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lfm2-rank}, as launch/local.sh has it.
std::string cache_dir() {
  const auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v && *v ? v : "";
  };
  if (!env("LFM2_CACHE_DIR").empty()) return env("LFM2_CACHE_DIR");
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/lfm2-rank";
  return (env("HOME").empty() ? std::string(".") : env("HOME")) + "/.cache/lfm2-rank";
}

}  // namespace

void resolve_default(RankOptions& opt) {
  const std::string dir = default_dir();
  const std::string recipe_path = dir + "/recipe.json";
  std::ifstream in(recipe_path);
  LFM2_CHECK(in.good(), recipe_path, ": the shipped default's recipe is missing; give --model and --inputs");
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    LFM2_FAIL(recipe_path, ": ", e.what());
  }
  const std::string preset = r.at("preset").get<std::string>(), dtype = r.at("dtype").get<std::string>();
  const int64_t seed = r.at("seed").get<int64_t>();
  // The model: beside the recipe (an older checkout made it there), else in the cache, where
  // launch/local.sh generates it on first use.
  opt.model = dir + "/" + r.at("model").get<std::string>();
  if (!fs::exists(opt.model)) opt.model = cat(cache_dir(), "/default/", preset, "-seed", seed, "-", dtype, ".h5");
  opt.inputs = dir + "/" + r.at("inputs").get<std::string>();
  if (opt.answers.empty()) opt.answers = dir + "/" + r.at("answers").get<std::string>();
  LFM2_CHECK(fs::exists(opt.model), opt.model, " is missing: create it with `mkdir -p ",
             fs::path(opt.model).parent_path().string(), " && h5pack synth ", opt.model, " --preset ", preset,
             " --seed ", seed, " --dtype ", dtype, "` (or run launch/local.sh with no options once)");
}

}  // namespace lfm2
