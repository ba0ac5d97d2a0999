// The jobs of lfm2-rank over one start-up (startup/phases.h): scoring (the next token of every prompt) and
// generation (--max-new-tokens). Start-up builds everything a job needs and agrees on it across
// ranks (RankSetup); a job then runs the pipeline, reports, validates and writes its output, and
// says how it ended. Nothing here depends on the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "io/model_config.h"
#include "io/seq_params.h"
#include "io/token_files.h"
#include "model/stage_executor.h"
#include "plan/layer_partition.h"
#include "plan/replica_work.h"
#include "rank/engine/pipeline.h"
#include "rank/batching/continuous_job.h"
#include "rank/jobs/generate_job.h"
#include "rank/jobs/result_writer.h"
#include "rank/jobs/score_job.h"
#include "rank/mpi/replica_layout.h"
#include "rank/mpi/world.h"
#include "rank/options.h"

namespace lfm2 {

// What start-up leaves for a job. The job runs on this rank's replica (pipe, its block of work)
// and reports, validates and writes for the whole job (world, every replica's work).
struct RankSetup {
  WorldConfig world;  // the job (MPI_COMM_WORLD)
  WorldConfig pipe;   // this rank's pipeline: stage pipe.rank of its replica
  ReplicaLayout layout;
  std::vector<ReplicaWork> work;  // per replica
  RankOptions opt;
  ModelConfig cfg;
  std::vector<StageLayers> stages;
  int64_t n_seq = 0, seq_len = 0;  // the whole inputs (N, S)
  int64_t microbatch = 1;          // this replica's
  DType dtype = DType::F32;
  bool use_cuda = false;
  TokenInputs inputs;    // a replica's first stage: its block
  TokenAnswers answers;  // the job's last rank, with --answers: all of them
  Pipeline* pipeline = nullptr;
  // Generation with the continuous scheduler (--scheduler continuous).
  bool continuous = false;
  std::vector<SeqSettings> settings;  // a replica's first stage: every sequence's parameters
  std::vector<int32_t> lengths;       // every prompt's length (empty: all seq_len)
  std::string inputs_fingerprint;     // rank 0: io/input_scan.h
  std::string model_fingerprint;      // rank 0
  ResultWriter* results = nullptr;     // rank 0: where every replica's finished sequences go
  double copy_bandwidth = 0;           // --benchmark on a GPU: this rank's, bytes/s (the memory floor)
  int64_t stage_weight_bytes = 0;      // this stage's weights, as its executor holds them
  bool per_sequence_sampling = false;  // some sequence samples other than the flags say
  int64_t max_new_tokens = 0;          // the most new tokens any sequence asks for (K of the outputs)
  int64_t longest = 0;                 // the most positions any sequence needs (prompt + new - 1)

  const ReplicaWork& mine() const { return work[size_t(pipe.replica)]; }
  std::vector<SeqBlock> blocks() const;
};

// How a job ended: its exit code, the last rank's report lines (rank 0 prints them) and rank 0's
// closing line.
struct JobOutcome {
  int code = 0;
  std::vector<std::string> lines;
  std::string done;
};

JobOutcome run_scoring(RankSetup& s, ScoreJob& job);
JobOutcome run_generation(RankSetup& s, GenerateJob& job);
JobOutcome run_continuous(RankSetup& s, ContinuousJob& job);
// Rank 0, continuous generation: where the finished sequences go, journaled with --output (resumed
// with --resume, refusing another job's journal in one line); made at start-up.
std::unique_ptr<ResultWriter> make_result_writer(const RankSetup& s, bool journal);

// Generation's results: every replica's tokens (mine: a replica's last stage's block), in input
// order, on the job's last rank; and what that rank reports, validates and writes of them.
GenerateResult gather_generated(const RankSetup& s, const GenerateResult& mine, int64_t n_new);
JobOutcome generation_outcome(const RankSetup& s, const GenerateResult& result);

// One plain run of a job's schedule on every rank (a traced run starts together, so that the ranks'
// timelines line up); rank 0 gets the run report's lines (steps: items per microbatch).
std::vector<std::string> run_once(RankSetup& s, const std::vector<StepPlan>& schedule, const StepMemory& memory,
                                  int64_t steps);

// The output file's run metadata common to both jobs.
nlohmann::json run_metadata(const RankSetup& s);

// The trace's metadata common to both jobs ("job": its name), and the trace itself, written by rank 0
// (its exit code: kExitError on rank 0 when the write failed, said in one line; else kExitOk).
nlohmann::json trace_meta(const RankSetup& s, const char* job, int64_t n_micro);
int deliver_job_trace(const RankSetup& s, const nlohmann::json& meta);

// The outputs of this job before its results: sequences, their padded length, the vocabulary.
TokenOutputs job_outputs(const RankSetup& s);
// Writes --output (the last rank). A write that fails (a full disk) is this rank's error alone:
// it is logged and the job ends together with exit 1 (`out.code`); no half-written file is left.
void write_job_outputs(const std::string& path, const TokenOutputs& o, const nlohmann::json& meta, JobOutcome& out);

}  // namespace lfm2
