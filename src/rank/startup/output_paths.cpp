#include "rank/startup/output_paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/output_guard.h"
#include "common/pending_file.h"
#include "io/partial_outputs.h"
#include "io/result_journal.h"

namespace lfm2 {
namespace {

// Creates and removes the file's temporary name: proves the directory takes a new file now, where
// access(2) would say yes to root on a read-only or virtual filesystem.
void check_creatable(const std::string& what, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LFM2_CHECK(!fs::is_directory(path, ec), what, " ", path, ": is a directory");
  const std::string dir = fs::absolute(path).parent_path().string();
  LFM2_CHECK(fs::is_directory(dir, ec), what, " ", path, ": cannot write into ", dir, ": no such directory");
  const std::string probe = pending_tmp_path(path);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  LFM2_CHECK(fd >= 0, what, " ", path, ": cannot write into ", dir, ": ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// The files this rank writes, as the command line names them; *n_given: how many the user named (the
// rest are made beside --output).
std::vector<NamedPath> rank_outputs(const RankOptions& opt, const WorldConfig& world, size_t* n_given) {
  std::vector<NamedPath> outputs;
  if (world.is_first() && !opt.trace.empty()) outputs.push_back({"--trace", opt.trace});
  // Continuous generation writes on rank 0 (jobs/result_writer.h), everything else on the last rank.
  const bool continuous = opt.max_new_tokens > 0 && opt.scheduler == "continuous";
  const bool writes_results = continuous ? world.is_first() : world.is_last();
  if (writes_results && !opt.output.empty()) outputs.push_back({"--output", opt.output});
  if (writes_results && !opt.results.empty()) outputs.push_back({"--results", opt.results});
  if (world.is_first() && !opt.metrics.empty()) outputs.push_back({"--metrics", opt.metrics});
  if (world.is_first() && !opt.prompts.empty()) outputs.push_back({"the encoded --prompts", opt.inputs});
  *n_given = outputs.size();
  // A continuous generation's --output has its journal and partial file beside it, written as the
  // job goes: neither may be an input or another output either.
  if (continuous && world.is_first() && !opt.output.empty()) {
    outputs.push_back({"--output's journal", journal_path(opt.output)});
    outputs.push_back({"--output's partial", partial_path(opt.output)});
  }
  return outputs;
}

}  // namespace

void check_run_outputs(const RankOptions& opt, const WorldConfig& world, int n_stages,
                       const std::function<std::string(int)>& weight_path) {
  std::vector<NamedPath> inputs;
  const bool per_stage = weight_path(0) != weight_path(n_stages - 1);
  const std::string of = n_stages == world.size ? "--model file of rank " : "--model file of stage ";
  for (int s = 0; s < (per_stage ? n_stages : 1); ++s)
    inputs.push_back({per_stage ? of + std::to_string(s) : "--model file", weight_path(s)});
  // --prompts: the inputs file is rank 0's output (the encoded prompts), the prompts an input.
  inputs.push_back(opt.prompts.empty() ? NamedPath{"--inputs file", opt.inputs} : NamedPath{"--prompts file", opt.prompts});
  inputs.push_back({"--answers file", opt.answers});
  size_t n_given = 0;
  const std::vector<NamedPath> outputs = rank_outputs(opt, world, &n_given);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    check_output_is_no_input(out, inputs);
    const bool trace = out.what == "--trace";
    LFM2_CHECK(!same_file(opt.trace, opt.output), out.what, " ", out.path, ": is also the ",
               trace ? "--output" : "--trace", " file; give them two paths");
    for (const NamedPath& other : outputs)
      LFM2_CHECK(&other == &out || !same_file(other.path, out.path), out.what, " ", out.path, ": is also the ",
                 other.what, " file; give them two paths");
    if (i >= n_given) continue;  // made beside --output: its directory is checked with it
    check_creatable(out.what, out.path);
    const std::string note = replacing_note(out.path);
    if (!note.empty()) log_info(out.what + ": " + note);
  }
}

}  // namespace lfm2
