#include "rank/startup/same_model.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/xxhash64.h"

namespace lfm2 {

void check_same_model(const WorldConfig& world, const WeightReader* weights, const std::string& path,
                      double timeout_s) {
  nlohmann::json mine = {{"open", weights != nullptr}, {"path", path}};
  if (weights) {
    mine["fingerprint"] = weights->identity() ? hex64(weights->identity()->fingerprint) : "";
    mine["stage_file"] = weights->is_stage_file();
  }
  const std::string text = mine.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // any path
  const std::vector<std::string> all = gather_strings(world, text, timeout_s, "comparing the model files");
  if (!world.is_first()) return;
  struct File {
    int rank;
    std::string path, fingerprint;
    bool stage_file;
  };
  std::vector<File> files;
  for (int r = 0; r < int(all.size()); ++r) {
    const auto j = nlohmann::json::parse(all[size_t(r)]);
    if (!j.at("open").get<bool>()) continue;  // that rank reports its own error
    files.push_back({r, j.at("path").get<std::string>(), j.at("fingerprint").get<std::string>(),
                     j.at("stage_file").get<bool>()});
  }
  if (files.empty()) return;
  auto name = [&](const File& f) { return cat(f.path, " (rank ", f.rank, ")"); };
  for (const File& f : files)
    LFM2_CHECK(!f.stage_file || !f.fingerprint.empty(), name(f),
               ": a stage file without a model fingerprint (written by an older h5pack): nothing proves it was cut "
               "from the same model as the others; split the model again with this h5pack");
  const File& first = files[0];
  for (const File& f : files) {
    if (f.fingerprint == first.fingerprint) continue;
    const File& with = f.fingerprint.empty() ? f : first;
    const File& without = f.fingerprint.empty() ? first : f;
    if (first.fingerprint.empty() || f.fingerprint.empty())
      LFM2_FAIL(name(without), " has no model fingerprint (an older h5pack) but ", name(with),
                " has one: ranks cannot prove they hold the same model; rewrite the old file with this h5pack");
    LFM2_FAIL(name(f), " holds another model than ", name(first), " (fingerprints ", f.fingerprint, " and ",
              first.fingerprint, "): give every rank files of one model (h5pack split of one file)");
  }
  if (first.fingerprint.empty())
    log_info(cat("warning: ", first.path,
                 " has no model fingerprint (written by an older h5pack): ranks cannot prove they read the same "
                 "model, nor the weights their digests; rewrite it with this h5pack (synth or convert)"));
  else
    log_info(cat("model: fingerprint ", first.fingerprint,
                 files.size() > 1 ? cat(", the same in the files of all ", files.size(), " ranks") : std::string()));
}

}  // namespace lfm2
