// Phase A and the replicas' work (phases.h): the options and files every rank opens, the inputs'
// shape and each replica's block of them.
#include <algorithm>
#include <climits>

#include "common/error.h"
#include "common/xxhash64.h"
#include "io/input_scan.h"
#include "io/model_text.h"
#include "io/seq_params.h"
#include "io/token_files.h"
#include "rank/jobs/text_front_end.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/world.h"
#include "rank/startup/checks.h"
#include "rank/startup/output_paths.h"
#include "rank/startup/phases.h"
#include "rank/startup/same_model.h"
#include "rank/startup/shipped_default.h"

namespace lfm2 {
namespace {

// The options alone: the backend's, the shipped default, the outputs (rank 0 writes the trace, the
// last rank the output: each is writable and no input, or fails now).
bool check_options(Startup& s) {
  RankOptions& opt = s.job.opt;
  const WorldConfig& world = s.job.world;
  const bool r0 = world.is_first();
  bool ok = startup_step([&] { check_backend_options(opt); }, r0);
  if (ok && opt.use_default) ok = startup_step([&] { resolve_default(opt); }, r0);
  if (ok && (opt.model.empty() || opt.inputs.empty()))
    ok = startup_step([&] { LFM2_FAIL("give both --model and --inputs (or neither, for the shipped default)"); }, r0);
  if (ok && (r0 || world.is_last()))
    ok = startup_step([&] {
      check_run_outputs(opt, world, s.job.pipe.size, [&](int stage) { return weight_path_for(opt.model, stage); });
    });
  if (ok) opt.text_model = weight_path_for(opt.model, 0);
  // --prompts: rank 0 encodes them into the inputs file, which every rank then reads as --inputs.
  if (ok && r0 && !opt.prompts.empty()) ok = startup_step([&] { encode_prompts(opt, opt.text_model); });
  return ok;
}

// Rank 0, generation: the EOS ids (--eos, else the model's generation_config, unless --eos none) and,
// for --prompts without --max-new-tokens, the model's max_new_tokens (else 256), at most what its
// positions allow after the longest prompt. The other ranks learn them in share_generation_defaults.
void pick_generation_defaults(RankOptions& opt, const ModelConfig& cfg, int64_t seq_len) {
  if (opt.max_new_tokens <= 0 || ((!opt.eos.empty() || opt.eos_off) && !opt.max_new_default)) return;
  const GenerationDefaults d = generation_defaults(read_model_text(opt.text_model, false));
  if (opt.eos.empty() && !opt.eos_off && !d.eos_ids.empty()) {
    opt.eos.assign(d.eos_ids.begin(), d.eos_ids.end());
    opt.eos_source = "the model's " + d.eos_source;
  }
  if (opt.max_new_default) {
    const int64_t room = cfg.max_position_embeddings - seq_len + 1;
    opt.max_new_tokens = std::max<int64_t>(1, std::min(d.max_new_tokens.value_or(kPromptsDefaultNewTokens), room));
  }
}

// This rank's weight file, and on rank 0 the inputs' shape (and prompt lengths).
bool open_weights(Startup& s) {
  const RankOptions& opt = s.job.opt;
  bool ok = startup_step([&] {
    s.weight_path = weight_path_for(opt.model, s.job.pipe.rank);
    s.weights = std::make_unique<WeightReader>(s.weight_path);
    s.weights->set_verify(opt.verify_weights);
    s.job.cfg = s.weights->config();
    s.job.model_fingerprint = s.weights->identity() ? hex64(s.weights->identity()->fingerprint) : "";
  });
  if (ok && s.job.world.is_first())
    ok = startup_step([&] {
      s.job.inputs = read_inputs_header(opt.inputs);
      check_input_shape(s.job.inputs, s.job.cfg.max_position_embeddings, opt.inputs);
      pick_generation_defaults(s.job.opt, s.job.cfg, s.job.inputs.seq_len);
      check_results_inputs(opt);
    });
  return ok;
}

// Rank 0's n ints to every rank.
std::vector<int32_t> broadcast_ints(const WorldConfig& world, std::vector<int32_t> v, int64_t n, double timeout_s) {
  v.resize(size_t(n));
  LFM2_CHECK(n <= INT32_MAX, "broadcasting ", n, " values");
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(v.data(), int(n), MPI_INT32_T, 0, world.comm, &req), "broadcasting the prompt lengths");
  wait_mpi_request(&req, timeout_s, "broadcasting the prompt lengths");
  return v;
}

// This replica's block of the inputs, read by its first stage: only its rows, only up to its
// longest prompt (an HDF5 hyperslab), checked, padding zeroed.
TokenInputs read_block(const std::string& path, const ReplicaWork& w, const ModelConfig& cfg) {
  TokenInputs in = read_inputs_block(path, w.seqs.begin, w.seqs.end, w.width);
  check_inputs(in, cfg.vocab_size, cfg.max_position_embeddings, path, w.seqs.begin);
  zero_padding(in);
  return in;
}

// Rank 0's picks of pick_generation_defaults to every rank: [max_new_tokens, n_eos, source] then the ids.
void share_generation_defaults(RankOptions& opt, const WorldConfig& world) {
  const std::vector<std::string> sources{"", "--eos", "the model's generation_config.json",
                                         "the model's tokenizer_config.json"};
  int32_t src = 0;
  for (size_t i = 0; i < sources.size(); ++i)
    if (opt.eos_source == sources[i]) src = int32_t(i);
  const std::vector<int32_t> head =
      broadcast_ints(world, {int32_t(opt.max_new_tokens), int32_t(opt.eos.size()), src}, 3, opt.timeout_s);
  std::vector<int32_t> ids(opt.eos.begin(), opt.eos.end());
  if (head[1] > 0) ids = broadcast_ints(world, ids, head[1], opt.timeout_s);
  opt.max_new_tokens = head[0];
  opt.eos.assign(ids.begin(), ids.end());
  opt.eos_source = sources.at(size_t(head[2]));
}

}  // namespace

Startup::Startup(const Replicas& reps, RankOptions options) : replicas(reps) {
  job.world = reps.world();  // the job: every agreement, the results, the exit code
  job.pipe = reps.pipe();    // this rank's pipeline: stage pipe.rank of pipe.size
  job.layout = reps.layout();
  job.opt = std::move(options);
}

bool open_files(Startup& s) {
  const RankOptions& opt = s.job.opt;
  const WorldConfig& world = s.job.world;
  bool ok = check_options(s) && open_weights(s);
  // Every rank's file holds the same model (fingerprints), or rank 0 names two that differ.
  const bool same = startup_step([&] { check_same_model(world, s.weights.get(), s.weight_path, opt.timeout_s); });
  ok = ok && same;
  // --device auto: CUDA only when every rank sees a GPU (one transport for the whole job).
  const TokenInputs& in = s.job.inputs;
  const auto agreed = allreduce_max(
      world, {ok ? 0 : 1, in.n_seq, in.seq_len, sees_gpu(opt) ? 0 : 1, in.lengths.empty() ? 0 : 1}, opt.timeout_s,
      "the start-up agreement");
  if (agreed[0] != 0) {
    report_startup_errors(world, opt.timeout_s);
    return false;
  }
  if (opt.max_new_tokens > 0) share_generation_defaults(s.job.opt, world);
  s.job.n_seq = agreed[1];
  s.job.seq_len = agreed[2];
  s.job.use_cuda = opt.device == "cuda" || (opt.device == "auto" && agreed[3] == 0);
  s.job.dtype = s.job.use_cuda ? parse_dtype(opt.dtype) : DType::F32;
  // Every rank learns the prompt lengths (the split balances them; the last stages read each
  // sequence's last position there).
  s.lengths = in.lengths;
  return agreed[4] == 0 ||
         startup_step([&] { s.lengths = broadcast_ints(world, s.lengths, s.job.n_seq, opt.timeout_s); });
}

// Generation: the per-sequence parameters (io/seq_params.h) of every sequence (continuous: the
// replicas pull from one queue) or of the block, each checked and resolved against the flags; the
// static scheduler takes none.
void read_settings(RankSetup& j, const std::vector<int32_t>& lengths) {
  const RankOptions& opt = j.opt;
  const SeqBlock w = j.continuous ? SeqBlock{0, j.n_seq} : j.mine().seqs;
  const SeqParamsBlock b = read_seq_params(opt.inputs, w.begin, w.end);
  LFM2_CHECK(j.continuous || !b.any(), opt.inputs, ": per-sequence parameters (max_new_tokens, temperature, ...) "
             "need --scheduler continuous");
  j.per_sequence_sampling = b.own_sampling();
  const SeqSettings flags{int32_t(opt.max_new_tokens), float(opt.temperature), int32_t(opt.top_k), float(opt.top_p),
                          opt.seed};
  j.settings.clear();
  for (int64_t i = 0; i < b.n; ++i) {
    const SeqSettings st = b.resolve(i, flags, opt.inputs);
    const int64_t len = lengths.empty() ? j.seq_len : lengths[size_t(w.begin + i)];
    const int64_t positions = len + st.max_new_tokens - 1;
    // (the flag's own reach is checked with the plan, check_generation)
    LFM2_CHECK(st.max_new_tokens == flags.max_new_tokens || positions <= j.cfg.max_position_embeddings, opt.inputs,
               ": sequence ", w.begin + i, ": ", len, " prompt tokens + ", st.max_new_tokens, " new need ", positions,
               " positions, past the model's max_position_embeddings ", j.cfg.max_position_embeddings);
    j.max_new_tokens = std::max<int64_t>(j.max_new_tokens, st.max_new_tokens);
    j.longest = std::max(j.longest, positions);
    j.settings.push_back(st);
  }
}

// Every rank learns the most new tokens and positions any sequence needs, and whether any samples
// by its own parameters.
bool agree_settings(RankSetup& j) {
  const auto all = allreduce_max(j.world, {j.max_new_tokens, j.longest, j.per_sequence_sampling ? 1 : 0},
                                 j.opt.timeout_s, "the per-sequence parameters");
  j.max_new_tokens = all[0];
  j.longest = all[1];
  j.per_sequence_sampling = all[2] != 0;
  return true;
}

bool split_work(Startup& s) {
  RankSetup& j = s.job;
  const RankOptions& opt = j.opt;
  const int R = j.layout.n_replicas, P = j.pipe.size;
  bool ok = startup_step(
      [&] {
        j.work = plan_work(split_sequences(sequence_costs(j.n_seq, j.seq_len, s.lengths, opt.max_new_tokens), R),
                           j.seq_len, s.lengths, opt.all_logits, opt.microbatch, P, j.use_cuda,
                           opt.max_new_tokens > 0);
      },
      j.world.is_first());
  j.continuous = opt.max_new_tokens > 0 && opt.scheduler == "continuous";
  // Continuous: the replicas read prompts as the queue hands them out; rank 0 scans them all now.
  if (ok && j.pipe.is_first() && !j.continuous)
    ok = startup_step([&] { j.inputs = read_block(opt.inputs, j.mine(), j.cfg); });
  if (ok && j.continuous && j.world.is_first())
    ok = startup_step([&] {
      j.inputs_fingerprint = scan_inputs(opt.inputs, j.cfg.vocab_size, j.cfg.max_position_embeddings);
    });
  if (ok && j.pipe.is_first() && opt.max_new_tokens > 0) ok = startup_step([&] { read_settings(j, s.lengths); });
  if (!all_ready(j.world, ok, opt.timeout_s, "the inputs agreement")) return false;
  j.microbatch = j.mine().microbatch;
  j.lengths = s.lengths;
  return opt.max_new_tokens <= 0 || agree_settings(j);
}

}  // namespace lfm2
