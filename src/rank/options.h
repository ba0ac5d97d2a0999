// The options of lfm2-rank, as parsed from the command line (options.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>


namespace lfm2 {

// The longest --timeout (about 11.6 days): past it the deadlines' arithmetic stops being exact.
inline constexpr double kMaxTimeoutS = 1e6;
// --prompts without --max-new-tokens and a model without generation_config max_new_tokens.
inline constexpr int64_t kPromptsDefaultNewTokens = 256;

struct RankOptions {
  std::string model;       // FILE.h5, or a pattern with %d for per-stage files ("stage-%d.h5")
  std::string inputs;      // input_ids (N, S) (with --prompts: the file rank 0 encodes them into)
  std::string prompts;     // optional: requests as JSONL, encoded by the text front end (docs/text.md)
  std::string results;     // optional: the outputs decoded into text as JSONL (generation)
  std::string answers;     // optional: validate against it
  std::string output;      // optional: write results here
  int64_t microbatch = 0;  // sequences per microbatch; 0: about 4 microbatches per stage
  int pipeline = 0;        // stages per pipeline (--pipeline P: R = ranks / P replicas); 0: all ranks, one
  std::string dtype = "fp32";   // fp32 | bf16 | fp16 (bf16 / fp16: CUDA only)
  std::string kv_dtype = "auto";  // generation's KV cache: auto (the compute dtype) | fp8 (e4m3, fp32 scales)
  std::string device = "auto";  // auto (cuda when built with it and every rank sees a GPU) | cpu | cuda
  bool tf32 = false;            // CUDA fp32: TF32 tensor cores for the GEMMs
  bool all_logits = false;
  bool benchmark = false;
  int repeat = 5, warmup = 1;
  std::string layers;  // "6,6,6,6" overrides the balanced split
  int threads = 0;     // 0: the node's cores shared among its ranks
  double timeout_s = 600;   // (0, kMaxTimeoutS]
  bool allow_nonfinite = false;  // NaN / Inf in hidden states or logits: warn instead of stopping
  bool verify_weights = true;    // check every tensor against its digest as it is loaded
  std::string trace;         // optional: write the run's timeline here (Chrome trace-event JSON)
  // Generation (--max-new-tokens > 0; 0: scoring).
  int64_t max_new_tokens = 0;
  double temperature = 0;    // 0: greedy
  int64_t top_k = 0;         // 0: all
  double top_p = 1;
  uint64_t seed = 0;
  std::vector<int64_t> eos;  // end-of-sequence ids (after start-up: the flag's, else the model's)
  bool eos_off = false;      // --eos none: no EOS, not even the model's
  std::string eos_source;    // where the ids came from: "--eos", the model's file, or "" (none)
  bool stream = false;       // print every token as a JSON event line on stdout as it comes
  // Continuous batching (batching/batch_scheduler.h).
  std::string scheduler = "continuous";  // continuous | static
  int64_t max_seqs = 256;                // sequences running at once
  int64_t max_batched_tokens = 0;        // rows per step; 0: 8192
  int64_t admit_wave = 0;                // free slots new prompts wait for while others decode; 0: max_seqs / 24
  bool prefill_first = true;             // continuous: due prompt rows get steps of their own
  int64_t page_size = 0;                 // positions per KV page; 0: by the longest sequence
  int64_t kv_pages = 0;                  // pages in the pool; 0: from gpu_memory (GPU) or enough (CPU)
  double gpu_memory = 0.9;               // the fraction of a GPU the job may fill
  int64_t prefill_chunk = 0;             // static: prompt rows a prefill item holds at most (0: whole)
  bool resume = false;                   // continuous: go on from --output's journal
  std::string metrics;                   // continuous: write the run's metrics here (JSON)
  bool cuda_graphs = true;   // CUDA: replay each stage's layers from a captured CUDA Graph
  bool use_default = false;  // no model/inputs given: run the shipped default under data/default
  int log_level = -1;        // 0 quiet, 1 normal, 2 verbose (--quiet / --verbose); -1: LFM2_LOG_LEVEL's
  bool max_new_default = false;  // --prompts without --max-new-tokens: start-up picks the model's default
  std::string text_model;    // the file whose text side encodes and decodes (stage 0's; set at start-up)
};

// The command line as parsed (before MPI starts, so that --timeout bounds MPI's start as well).
struct ParsedOptions {
  RankOptions opt;
  int code = -1;      // -1: parsed; else the exit code after reporting (0 for --help)
  std::string error;  // the parse error, which rank 0 prints once
};
// `print_help`: this process prints --help (rank 0 of the launch).
ParsedOptions parse_options(int argc, char** argv, bool print_help);

class Replicas;

// Runs the program on this rank, a stage of one of the job's replicas (mpi/replica_comms.h);
// returns its exit code (mpi/fatal.h). Ends the job through MPI_Abort on an error after the
// exchange has started (run_rank.cpp).
int run_rank(const Replicas& replicas, RankOptions opt);

}  // namespace lfm2
