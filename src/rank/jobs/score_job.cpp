#include "rank/jobs/score_job.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "rank/jobs/schedulers.h"

namespace lfm2 {

int64_t PipelineShape::micro_size(int64_t m) const { return std::min(microbatch, n_seq - m * microbatch); }

int64_t PipelineShape::max_micro_tokens() const { return std::min(microbatch, n_seq) * seq_len; }

ScoreJob::ScoreJob(const WorldConfig& world, StageExecutor& exec, const PipelineShape& shape)
    : world_(world), exec_(exec), shape_(shape) {
  LFM2_CHECK(shape_.n_seq > 0 && shape_.seq_len > 0 && shape_.microbatch > 0, "pipeline: empty batch");
  const int64_t N = shape_.n_seq, S = shape_.seq_len, V = shape_.vocab;
  auto host = [&](int64_t bytes) { return exec_.alloc_host(bytes); };
  if (world_.is_first()) ids_ = static_cast<int32_t*>(host(N * S * int64_t(sizeof(int32_t))));
  if (world_.is_last()) {
    next_token_ = static_cast<int32_t*>(host(N * int64_t(sizeof(int32_t))));
    margin_ = static_cast<float*>(host(N * int64_t(sizeof(float))));
    if (shape_.logits) logits_ = static_cast<float*>(host(N * V * int64_t(sizeof(float))));
    if (shape_.all_logits) all_logits_ = static_cast<float*>(host(N * S * V * int64_t(sizeof(float))));
  }
  if (world_.is_last() && !shape_.lengths.empty()) {
    LFM2_CHECK(int64_t(shape_.lengths.size()) == N, "pipeline: ", shape_.lengths.size(), " lengths for ", N,
               " sequences");
    lengths_ = static_cast<int32_t*>(host(N * int64_t(sizeof(int32_t))));
    std::copy(shape_.lengths.begin(), shape_.lengths.end(), lengths_);
  }
  // The schedule, and what its steps read and write here.
  schedule_ = score_schedule(N, S, shape_.microbatch, shape_.lengths);
  memory_.ids = ids_;
  memory_.width = S;
  memory_.head = {next_token_, margin_, logits_, all_logits_};
  memory_.lengths = lengths_;
  memory_.vocab = V;
}

void ScoreJob::set_ids(const int32_t* ids) {
  if (!world_.is_first()) return;
  LFM2_CHECK(ids, "pipeline: the first stage needs the input ids");
  std::memcpy(ids_, ids, size_t(shape_.n_seq * shape_.seq_len) * sizeof(int32_t));
}

void ScoreJob::take_results(PipelineResult* result) const {
  LFM2_CHECK(result, "pipeline: the last stage needs a result");
  if (!world_.is_last()) return;
  const int64_t N = shape_.n_seq, S = shape_.seq_len, V = shape_.vocab;
  result->next_token.assign(next_token_, next_token_ + N);
  result->margin.assign(margin_, margin_ + N);
  result->logits.assign(logits_, logits_ ? logits_ + N * V : logits_);
  result->all_logits.assign(all_logits_, all_logits_ ? all_logits_ + N * S * V : all_logits_);
}

}  // namespace lfm2
