#include "rank/jobs/generate_job.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "rank/jobs/schedulers.h"

namespace lfm2 {

int64_t GenerateShape::micro_size(int64_t g) const { return std::min(microbatch, n_seq - g * microbatch); }

// A decode item is a row per sequence plus the finished flags (decode_buffer_floats): two rows'
// room per sequence cover it when the prompts are one token long.
int64_t GenerateShape::max_item_tokens() const { return std::min(microbatch, n_seq) * std::max<int64_t>(seq_len, 2); }

GenerateJob::GenerateJob(const WorldConfig& world, StageExecutor& exec, const GenerateShape& shape,
                         const SamplingParams& sampling)
    : world_(world), exec_(exec), shape_(shape), eos_(sampling.eos) {
  const int64_t N = shape_.n_seq, S = shape_.seq_len, K = shape_.max_new_tokens;
  LFM2_CHECK(N > 0 && S > 0 && shape_.microbatch > 0 && K > 0, "generation: empty batch");
  LFM2_CHECK(exec_.act_dtype() == DType::F32, "generation: hidden states must be fp32 (the decode flags are)");
  if (shape_.lengths.empty()) shape_.lengths.assign(size_t(N), int32_t(S));
  exec_.alloc_state(N, shape_.max_len(), shape_.lengths.data(), sampling);
  if (world_.is_first()) ids_ = static_cast<int32_t*>(exec_.alloc_host(N * S * int64_t(sizeof(int32_t))));
  if (world_.is_first() || world_.is_last())
    for (int64_t g = 0; g < shape_.n_micro(); ++g) tokens_.push_back(exec_.alloc_tokens(shape_.micro_size(g)));
  if (world_.is_last()) {
    last_tokens_ = exec_.alloc_tokens(std::min(shape_.microbatch, N));
    host_tokens_ = static_cast<int32_t*>(exec_.alloc_host(K * N * int64_t(sizeof(int32_t))));
  }
  memory_.ids = ids_;
  memory_.width = S;
  memory_.token_slots = tokens_;
  memory_.spare_tokens = last_tokens_;
  memory_.host_tokens = host_tokens_;
  memory_.n_seq = N;
  set_steps(K);
}

void GenerateJob::set_ids(const int32_t* ids) {
  if (!world_.is_first()) return;
  LFM2_CHECK(ids, "generation: the first stage needs the prompts");
  std::memcpy(ids_, ids, size_t(shape_.n_seq * shape_.seq_len) * sizeof(int32_t));
}

void GenerateJob::set_steps(int64_t steps) {
  LFM2_CHECK(steps >= 1 && steps <= shape_.max_new_tokens, "generation: ", steps, " steps of ",
             shape_.max_new_tokens);
  if (steps == steps_ && !schedule_.empty()) return;
  steps_ = steps;
  schedule_ = generation_schedule(shape_.n_seq, shape_.seq_len, shape_.microbatch, shape_.lengths, steps_);
}

void GenerateJob::take_results(GenerateResult* result) const {
  LFM2_CHECK(result, "generation: the last stage needs a result");
  if (!world_.is_last()) return;
  const int64_t N = shape_.n_seq, K = shape_.max_new_tokens;
  result->n_new = K;
  result->generated.assign(size_t(N * K), 0);
  result->n_generated.assign(size_t(N), int32_t(K));
  for (int64_t s = 0; s < N; ++s)
    for (int64_t t = K - 1; t >= 0; --t) {
      const int32_t tok = host_tokens_[t * N + s];
      result->generated[size_t(s * K + t)] = tok;
      if (std::find(eos_.begin(), eos_.end(), tok) != eos_.end()) result->n_generated[size_t(s)] = int32_t(t + 1);
    }
}

}  // namespace lfm2
