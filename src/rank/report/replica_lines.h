// What rank 0 prints about replicas (replicas.h): the grouping and each replica's work in the plan,
// each replica's busy times and bubble after a run, and validation per replica. With one replica
// the plan and the validation add nothing and the run report is pipeline_report's, as before.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/token_files.h"
#include "plan/layer_partition.h"
#include "plan/replica_work.h"
#include "rank/engine/pipeline.h"
#include "rank/mpi/replica_layout.h"
#include "rank/report/validate.h"

namespace lfm2 {

// "plan: replica 1: ranks 3-5 on node-b, sequences 6-11 (6 x 9 tokens in 3 microbatches of 2,
// GPipe bubble 40.0%)", one line per replica, after one line on the grouping; none for one replica.
std::vector<std::string> replica_plan_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                            const std::vector<std::string>& hosts);

// The run report from every rank's timing (in rank order): each replica's busy times and bubble
// (pipeline_report's lines, "pipeline: replica 1: ..."), and how long the replicas waited for the
// slowest. steps: items per microbatch (1 when scoring, the generated tokens when generating).
std::vector<std::string> replica_pipeline_report(const std::vector<StageTiming>& timing, const ReplicaLayout& layout,
                                                 const std::vector<ReplicaWork>& work,
                                                 const std::vector<StagePlan>& plans, int64_t steps);

// Validation per replica, on its block of the answers: "validation: replica 1 (sequences 6-11 on
// ranks 3-5): top-1 6/6, near-ties 0, max |dlogit| 0.0003 (sequence 8)". None for one replica.
std::vector<std::string> replica_score_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                             const std::vector<int32_t>& next_token, const std::vector<float>& logits,
                                             int64_t vocab, const TokenAnswers& answers, const Tolerance& tol);
// The same for generated tokens: "validation: replica 1 (...): 42/42 tokens equal, 6/6 sequences whole".
std::vector<std::string> replica_generation_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                                  const std::vector<int32_t>& generated, int64_t n_new,
                                                  const TokenAnswers& answers, bool exact);

}  // namespace lfm2
