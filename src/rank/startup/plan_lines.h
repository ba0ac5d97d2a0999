// The plan rank 0 prints once before the exchange: how the layers were split, the backend and the
// transport, the replicas and their work, and each rank's layers, memory and GPU, from facts every
// rank gathers to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rank/jobs/job_setup.h"
#include "rank/mpi/world.h"
#include "rank/options.h"
#include "rank/startup/gpu_identity.h"

namespace lfm2 {

// One rank's facts for the plan (int64 fields only: they travel as one MPI_Igather).
struct RankFacts {
  int64_t layer_begin = 0, layer_end = 0, weight_bytes = 0, bytes_read = 0, free_host = -1, local_rank = 0;
  int64_t gpu = -1, gpu_weight_bytes = 0, gpu_free = 0, gpu_total = 0;  // gpu -1: the CPU backend
  int64_t started_us = -1, load_us = 0;  // start-up (report/startup_line.h)
};

// Every rank's facts on rank 0 (in rank order), against timeout_s.
std::vector<RankFacts> gather_facts(const WorldConfig& world, const RankFacts& mine, double timeout_s);

// What the plan says beside the layers: how they were split, the backend, the transport.
struct PlanText {
  std::string how, backend, transport;
};
PlanText plan_text(const RankOptions& opt, bool stage_files, bool use_cuda, int n_threads, const char* transport);

// Rank 0 logs the plan (gpus: every rank's, with the CUDA backend; hosts: every rank's).
void print_plan(const RankSetup& s, const PlanText& t, const std::vector<RankFacts>& all,
                const std::vector<GpuFacts>& gpus, const std::vector<std::string>& hosts);

// "generation: up to 256 new tokens a sequence (the default of --prompts), EOS 7, 2 (the model's
// generation_config.json)": what generation stops at, and why (rank 0 prints it with the plan).
std::string generation_line(const RankOptions& opt);

}  // namespace lfm2
