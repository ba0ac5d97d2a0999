#include "rank/startup/shipped_default.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace lfm2 {
namespace {

namespace fs = std::filesystem;

std::string default_dir() {
  if (fs::exists("data/default/recipe.json")) return "data/default";
  return std::string(LFM2_SOURCE_DIR) + "/data/default";
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
  opt.model = dir + "/" + r.at("model").get<std::string>();
  opt.inputs = dir + "/" + r.at("inputs").get<std::string>();
  if (opt.answers.empty()) opt.answers = dir + "/" + r.at("answers").get<std::string>();
  LFM2_CHECK(fs::exists(opt.model), opt.model, " is missing: create it with `h5pack synth ", opt.model, " --preset ",
             r.at("preset").get<std::string>(), " --seed ", r.at("seed").get<int64_t>(), " --dtype ",
             r.at("dtype").get<std::string>(), "` (build/src/h5pack/h5pack)");
}

}  // namespace lfm2
