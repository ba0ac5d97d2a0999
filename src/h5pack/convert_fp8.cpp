#include "h5pack/convert_fp8.h"

#include <filesystem>
#include <optional>

#include "common/error.h"
#include "common/pending_file.h"
#include "h5pack/convert.h"
#include "io/model_config.h"

namespace lfm2 {

void convert_checkpoint_fp8(const std::string& dir, const std::string& out, const QuantizeOptions& opt,
                            bool scheme_given) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  LFM2_CHECK(std::filesystem::exists(config_path), config_path, ": missing (a checkpoint directory holds config.json)");
  if (ModelConfig::from_file(config_path).fp8.on) {
    LFM2_CHECK(!scheme_given, dir, ": the checkpoint is FP8 already (its scales are kept); drop --scheme / --dense");
    convert_checkpoint(dir, out, std::nullopt, opt.progress);
    return;
  }
  // The bf16 pass's file is this PendingFile's temporary name ("OUT.bf16.tmp.<host>.<pid>"): it is
  // tracked for the signal handler and removed when `interim` dies; never committed.
  PendingFile interim(out + ".bf16");
  convert_checkpoint(dir, interim.tmp_path(), std::nullopt, opt.progress);
  QuantizeOptions q = opt;
  q.source = cat("h5pack convert --dtype fp8 --scheme ", fp8_scheme_name(opt.scheme), opt.projections ? " --dense " : " ",
                 std::filesystem::absolute(dir).lexically_normal().string());
  quantize_weights(interim.tmp_path(), out, q);
}

}  // namespace lfm2
