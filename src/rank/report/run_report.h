// The run report of lfm2-rank's jobs: lines from the last rank to rank 0, each stage's busy time and
// the bubble, and small formatting helpers shared by the reports.
#pragma once

#include <string>
#include <vector>

#include "plan/layer_partition.h"
#include "plan/replica_work.h"
#include "rank/engine/pipeline.h"
#include "rank/mpi/replica_layout.h"
#include "rank/mpi/world.h"

namespace lfm2 {

// The last rank's report lines reach rank 0, which prints them (each rank calls it; with replicas,
// the job's last rank, which gathered every replica's results).
void deliver_report(const WorldConfig& world, const std::vector<std::string>& lines, double timeout_s);

// Each rank's busy and wall time of one run, gathered to rank 0 (in rank order); past timeout_s
// rank 0 names the ranks (and replicas) it heard nothing from.
std::vector<StageTiming> gather_timing(const WorldConfig& world, const ReplicaLayout& layout, const StageTiming& mine,
                                       double timeout_s);

// "pipeline: busy per stage ...; spread", "pipeline: wall ...; bubble ... measured, GPipe ..."
std::vector<std::string> pipeline_report(const std::vector<StageTiming>& timing, const std::vector<StageLayers>& stages,
                                         int64_t n_items);

// The run report from every rank's timing (in rank order): each replica's busy times and bubble
// (pipeline_report's lines, "pipeline: replica 1: ..."), and how long the replicas waited for the
// slowest. steps: items per microbatch (1 when scoring, the generated tokens when generating).
std::vector<std::string> replica_pipeline_report(const std::vector<StageTiming>& timing, const ReplicaLayout& layout,
                                                 const std::vector<ReplicaWork>& work,
                                                 const std::vector<StageLayers>& stages, int64_t steps);

std::string utc_now();                   // "2026-11-23T01:07:47Z"
std::string fixed(double v, int digits);  // printf("%.*f")
std::string mib(int64_t bytes);           // "41.7 MiB"
std::string gib(int64_t bytes);           // "1.3 GiB"
std::string layer_counts(const std::vector<StageLayers>& stages);  // "6,6,6,6"

}  // namespace lfm2
