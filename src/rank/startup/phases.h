// Start-up in agreed phases, so that a rank's failure stops every rank before any hidden state
// moves (run_rank.cpp runs them in order, then the exchange):
//
//   open_files      (A) the options, this rank's weight file, rank 0 the inputs' shape; all agree on
//                   (N, S), the backend and the same model, and learn the prompt lengths
//   split_work      one block of sequences per replica (plan/replica_work.h); each replica's first
//                   stage reads and checks its own block; all agree
//   load_stage      (B) the layers of each stage, one GPU per rank, this rank's stage and transport
//                   (backend.h), the last rank's answers, the job's buffers; all agree again;
//                   continuous batching: every stage's pool of KV pages, the smallest any stage can
//                   hold, then the state allocated; agreed once more
//   connect_stages  (B') with NCCL, each replica's communicators and their warm-up; agreed once more
//
// Every agreement is over the whole job (one replica's error stops all of them); the pipeline, its
// transport and its job are the replica's. Each phase returns false when the job must end (exit 1):
// the errors have then been reported once, by the lowest rank that has each.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "rank/engine/pipeline.h"
#include "rank/jobs/generate_job.h"
#include "rank/jobs/job_setup.h"
#include "rank/jobs/score_job.h"
#include "rank/mpi/replica_comms.h"
#include "rank/options.h"
#include "rank/startup/backend.h"
#include "rank/startup/gpu_identity.h"
#include "rank/startup/plan_lines.h"

namespace lfm2 {

// What start-up learns and builds on this rank, phase by phase.
struct Startup {
  Startup(const Replicas& replicas, RankOptions options);

  const Replicas& replicas;
  RankSetup job;  // what the job gets (jobs/job_setup.h), filled in phase by phase
  std::string weight_path;
  std::unique_ptr<WeightReader> weights;
  std::vector<int32_t> lengths;  // every prompt's length (empty: all seq_len)
  int n_threads = 1;             // CPU threads of this rank
  std::vector<GpuFacts> gpus;    // every rank's GPU, with the CUDA backend
  RankFacts facts;               // this rank's, for the plan
  Backend backend;
  std::unique_ptr<StageExecutor> checked;  // the NaN checks around the backend's executor
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<ScoreJob> score;        // the job: scoring,
  std::unique_ptr<GenerateJob> generate;  // or generation (--max-new-tokens): static,
  std::unique_ptr<ContinuousJob> continuous;  // or continuous (its shape until the pool is agreed)
  ContinuousShape continuous_shape;
  int64_t pool_pages = 0;                 // the pages this rank could hold
  std::unique_ptr<ResultWriter> results;  // rank 0: continuous generation's results (and journal)
};

bool open_files(Startup& s);
bool split_work(Startup& s);
bool load_stage(Startup& s);
bool connect_stages(Startup& s);

}  // namespace lfm2
