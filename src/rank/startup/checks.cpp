#include "rank/startup/checks.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "common/xxhash64.h"
#include "io/model_text.h"
#include "io/token_files.h"

namespace lfm2 {

std::string weight_path_for(const std::string& model, int stage) {
  const size_t pos = model.find("%d");
  if (pos == std::string::npos) return model;
  LFM2_CHECK(model.find("%d", pos + 2) == std::string::npos, "--model '", model, "' has more than one %d");
  return model.substr(0, pos) + std::to_string(stage) + model.substr(pos + 2);
}

int64_t free_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

int default_threads(const WorldConfig& world) {
  const int node_cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int shared = std::max(1, node_cores / std::max(1, world.local_size));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return shared;
  const int mine = CPU_COUNT(&set);
  return mine < node_cores ? std::max(1, mine) : shared;
}

std::vector<StageLayers> plan_stages(const RankOptions& opt, const ModelConfig& cfg, bool stage_files, int P, int64_t S,
                                   bool use_cuda) {
  const int L = int(cfg.num_hidden_layers);
  if (opt.pipeline > 0)
    LFM2_CHECK(P <= L, "--pipeline ", P, ": cannot run ", P, " stages: the model has ", L,
               " layers (one stage needs at least one)");
  LFM2_CHECK(P <= L, "cannot run ", P, " ranks: the model has ", L, " layers (one rank needs at least one)");
  if (!opt.layers.empty()) return make_stages(parse_layer_counts(opt.layers, L, P));
  if (stage_files) return default_stages(cfg, P);
  return default_stages(cfg, P, S, opt.all_logits, use_cuda ? CostModel::kGpu : CostModel::kFlops);
}

void check_stage_file(const StageLayers& s, const std::string& path, const StageLayers& plan, const WorldConfig& world,
                      const WorldConfig& pipe, int n_replicas, const RankOptions& opt) {
  const int P = pipe.size;
  LFM2_CHECK(s == plan,
             path, ": stage file for stage ", s.stage, "/", s.n_stages, " layers [", s.layer_begin, ", ", s.layer_end,
             "), but ",
             n_replicas == 1 ? cat("rank ", pipe.rank, "/", P) : cat("rank ", world.rank, " (stage ", pipe.rank, "/", P, ")"),
             " runs layers [", plan.layer_begin, ", ", plan.layer_end, ")",
             opt.layers.empty() ? " (split it for this plan, or pass its split as --layers)" : " (--layers)");
}

void check_generation(const RankOptions& opt, const ModelConfig& cfg, int64_t seq_len) {
  if (opt.max_new_tokens <= 0) return;
  LFM2_CHECK(!opt.all_logits, "--all-logits scores prompts; it does not go with --max-new-tokens");
  LFM2_CHECK(seq_len + opt.max_new_tokens - 1 <= cfg.max_position_embeddings, "--max-new-tokens ",
             opt.max_new_tokens, " after prompts of up to ", seq_len, " tokens needs ", seq_len + opt.max_new_tokens - 1,
             " positions, past the model's max_position_embeddings ", cfg.max_position_embeddings);
  for (int64_t e : opt.eos)
    LFM2_CHECK(e >= 0 && e < cfg.vocab_size, "--eos ", e, " is outside the vocabulary [0, ", cfg.vocab_size, ")");
  LFM2_CHECK(opt.page_size == 0 || (opt.page_size & (opt.page_size - 1)) == 0, "--page-size ", opt.page_size,
             " is not a power of two");
  const bool continuous = opt.scheduler == "continuous";
  LFM2_CHECK(!opt.resume || (continuous && !opt.output.empty()), "--resume goes on from an --output's journal: ",
             continuous ? "give --output" : "it needs --scheduler continuous");
  LFM2_CHECK(opt.metrics.empty() || continuous, "--metrics needs --scheduler continuous");
  LFM2_CHECK(!opt.resume || !opt.benchmark, "--resume does not go with --benchmark");
}

void check_results_inputs(const RankOptions& opt) {
  if (opt.results.empty() || !opt.prompts.empty()) return;
  const ModelText text = read_model_text(opt.text_model, false);
  LFM2_CHECK(text.has("tokenizer.json"), "--results: model ", opt.text_model,
             " carries no tokenizer (text/tokenizer.json) to turn the tokens into text; convert the checkpoint with "
             "its tokenizer files (h5pack convert DIR OUT.h5), or leave out --results (--output keeps the tokens)");
  const InputsProvenance in = read_inputs_provenance(opt.inputs);
  LFM2_CHECK(in.missing_dataset.empty(), "--results: inputs ", opt.inputs, " has no ", in.missing_dataset,
             " (not written by tools/lfm2_text.py encode): give the requests as --prompts, or leave out --results");
  const std::string model_fp = hex64(text_fingerprint(text));
  LFM2_CHECK(in.text_fingerprint.empty() || in.text_fingerprint == model_fp, "--results: inputs ", opt.inputs,
             " were encoded with another tokenizer (text fingerprint ", in.text_fingerprint, ") than model ",
             opt.text_model, "'s (", model_fp, ")");
}

void check_state_fits(const StageExecutor& exec, const GenerateShape& shape, bool on_gpu) {
  const int64_t need = exec.state_bytes(shape.n_seq, shape.max_len());
  if (on_gpu) return;  // the CUDA executor names the bytes itself when its allocation fails
  const int64_t free = free_host_bytes();
  LFM2_CHECK(free < 0 || need <= free, "the generation state (KV cache and conv state) of ", shape.n_seq,
             " sequences x ", shape.max_len(), " positions needs ", need >> 20, " MiB on this rank, ", free >> 20,
             " MiB of host memory are free (fewer sequences, shorter prompts or fewer new tokens)");
}

}  // namespace lfm2
