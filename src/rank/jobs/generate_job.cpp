#include "rank/jobs/generate_job.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "model/step_layout.h"
#include "rank/jobs/schedulers.h"

namespace lfm2 {

int64_t GenerateShape::micro_size(int64_t g) const { return std::min(microbatch, n_seq - g * microbatch); }

// A decode item is a row per sequence plus the finished flags (decode_buffer_floats): two rows'
// room per sequence cover it when the prompts are one token long. Prefill chunks: at most the chunk,
// or the item of every prompt's last row.
int64_t GenerateShape::max_item_tokens() const {
  const int64_t mb = std::min(microbatch, n_seq);
  const int64_t prefill = prefill_chunk > 0 ? std::min(std::max(prefill_chunk, mb), mb * seq_len) : mb * seq_len;
  return std::max(prefill, 2 * mb);
}

StateShape GenerateShape::state() const { return old_state_shape(n_seq, max_len()); }

GenerateJob::GenerateJob(const WorldConfig& world, StageExecutor& exec, const GenerateShape& shape,
                         const SamplingParams& sampling)
    : world_(world), exec_(exec), shape_(shape), eos_(sampling.eos) {
  const int64_t N = shape_.n_seq, S = shape_.seq_len, K = shape_.max_new_tokens;
  LFM2_CHECK(N > 0 && S > 0 && shape_.microbatch > 0 && K > 0, "generation: empty batch");
  LFM2_CHECK(exec_.act_dtype() == DType::F32, "generation: hidden states must be fp32 (the decode flags are)");
  if (shape_.lengths.empty()) shape_.lengths.assign(size_t(N), int32_t(S));
  exec_.alloc_batch_state(shape_.state(), sampling);
  int64_t total = 0;
  for (int32_t n : shape_.lengths) total += n;
  if (world_.is_first()) ids_ = static_cast<int32_t*>(exec_.alloc_host(total * int64_t(sizeof(int32_t))));
  if (world_.is_first() || world_.is_last())
    for (int64_t g = 0; g < shape_.n_micro(); ++g) tokens_.push_back(exec_.alloc_tokens(shape_.micro_size(g)));
  if (world_.is_last()) {
    last_tokens_ = exec_.alloc_tokens(std::min(shape_.microbatch, N));
    host_tokens_ = static_cast<int32_t*>(exec_.alloc_host(K * N * int64_t(sizeof(int32_t))));
  }
  memory_.seq_base = sampling.first_sequence;
  memory_.packed_ids = ids_;
  memory_.token_slots = tokens_;
  memory_.spare_tokens = last_tokens_;
  memory_.host_emits = host_tokens_;
  set_steps(K);
}

// The prompts (N, S), right-padded: each item's prompt rows, item after item (every schedule of
// this job has the same prefill items).
void GenerateJob::set_ids(const int32_t* ids) {
  if (!world_.is_first()) return;
  LFM2_CHECK(ids, "generation: the first stage needs the prompts");
  for (const StepPlan& p : schedule_) {
    int64_t at = p.ids_offset;
    for (const SeqRows& r : p.seqs) {
      if (r.decode) continue;
      std::memcpy(ids_ + at, ids + r.seq * shape_.seq_len + r.first_pos, size_t(r.n_rows) * sizeof(int32_t));
      at += r.n_rows;
    }
  }
}

void GenerateJob::set_steps(int64_t steps) {
  LFM2_CHECK(steps >= 1 && steps <= shape_.max_new_tokens, "generation: ", steps, " steps of ",
             shape_.max_new_tokens);
  if (steps == steps_ && !schedule_.empty()) return;
  steps_ = steps;
  schedule_ = generation_schedule(shape_.n_seq, shape_.seq_len, shape_.microbatch, shape_.lengths, steps_,
                                  shape_.state(), shape_.prefill_chunk);
}

void GenerateJob::take_results(GenerateResult* result) const {
  LFM2_CHECK(result, "generation: the last stage needs a result");
  if (!world_.is_last()) return;
  const int64_t N = shape_.n_seq, K = shape_.max_new_tokens;
  result->n_new = K;
  result->generated.assign(size_t(N * K), 0);
  result->n_generated.assign(size_t(N), int32_t(K));
  for (const StepPlan& p : schedule_) {
    int64_t e = p.emit_offset;
    for (const SeqRows& r : p.seqs)
      if (r.gen_step >= 0) result->generated[size_t(r.seq * K + r.gen_step)] = host_tokens_[e++];
  }
  for (int64_t s = 0; s < N; ++s)
    for (int64_t t = K - 1; t >= 0; --t)
      if (std::find(eos_.begin(), eos_.end(), result->generated[size_t(s * K + t)]) != eos_.end())
        result->n_generated[size_t(s)] = int32_t(t + 1);
}

}  // namespace lfm2
