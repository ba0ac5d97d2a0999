#include "rank/batching/continuous_job.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace lfm2 {
namespace {

// Plans kept for the interpreter's references back (its buffers, waits that name an item).
constexpr int64_t kKeepBehind = 8;

}  // namespace

int64_t ContinuousShape::max_item_tokens() const {
  return max_batched_tokens + (state.n_slots + hidden - 1) / std::max<int64_t>(hidden, 1);
}

SchedulerFeed::SchedulerFeed(const SchedulerConfig& config, PlanLink* link, const Staging& staging,
                             PromptSource& source, Sink sink, Idle idle, double timeout_s)
    : sched_(config), link_(link), source_(source), sink_(std::move(sink)), idle_(std::move(idle)),
      timeout_s_(timeout_s), staging_(staging) {
  if (!idle_) idle_ = [] {};
  const int64_t flight = config.max_in_flight + (config.look_ahead ? 1 : 0);
  LFM2_CHECK(int64_t(staging_.ids.size()) == flight + 1 && staging_.fed.size() == staging_.ids.size(), "scheduler: ",
             staging_.ids.size(), " staging buffers for ", flight, " items in flight");
  LFM2_CHECK(!config.look_ahead || !link_, "scheduler: look-ahead with more than one stage");
}

// Keeps a slot's worth of prompts queued beside the running sequences (read as they are needed, not
// all at once; few enough that replicas pulling from one queue end together).
void SchedulerFeed::top_up() {
  const int64_t want = sched_.config().max_seqs + 16;
  SeqRequest r;
  std::vector<int32_t> ids;
  while (!source_done_ && sched_.n_waiting() < want) {
    const PromptSource::Next got = source_.next(&r, &ids);
    if (got == PromptSource::Next::kLater) break;
    if (got == PromptSource::Next::kEnd) {
      source_done_ = true;
      break;
    }
    LFM2_CHECK(int64_t(ids.size()) == r.prompt_len, "sequence ", r.seq, ": ", ids.size(), " ids for a prompt of ",
               r.prompt_len);
    sched_.add(r, now_s());
    prompts_[r.seq] = std::move(ids);
    ++added_;
  }
}

void SchedulerFeed::complete(int64_t item, const int32_t* tokens, int64_t n) {
  sched_.complete(item, tokens, n, now_s());
  for (FinishedSeq& f : sched_.take_finished()) {
    prompts_.erase(f.seq);
    sink_(std::move(f));
  }
}

// The tokens of items in flight that came back on the link (all that arrived; at least one when
// `wait`).
void SchedulerFeed::take_reports(bool wait) {
  if (!link_) return;
  int64_t item = 0;
  std::vector<int32_t> tokens;
  bool got = false;
  auto arrived = [&] {
    if (link_->recv_tokens(&item, &tokens, false)) return true;
    idle_();
    return false;
  };
  while ((got = wait ? poll_until(arrived, timeout_s_) : link_->recv_tokens(&item, &tokens, false))) {
    complete(item, tokens.data(), int64_t(tokens.size()));
    wait = false;
  }
  if (wait && !got)
    LFM2_TIMEOUT("timed out after ", timeout_s_, " s waiting for the tokens of item ", sched_.oldest_in_flight(),
                 " from the last stage (did it stop? see --timeout)");
}

// One stage: the oldest item queued, once its tokens are on the host (waiting for them). Taken only
// when the scheduler cannot plan without it, so that the same rows are planned ahead whatever the
// timing. False when none is queued.
bool SchedulerFeed::take_local() {
  if (local_.empty()) return false;
  const Local l = std::move(local_.front());
  local_.pop_front();
  l.done(true);
  complete(l.item, l.tokens, l.n);
  return true;
}

const StepPlan* SchedulerFeed::next(int64_t i) {
  double waited_from = -1;
  for (;;) {
    idle_();
    top_up();
    take_reports(false);
    StepPlan p;
    if (sched_.may_plan() && sched_.plan(i, &p)) {
      LFM2_CHECK(i == base_ + int64_t(window_.size()), "scheduler: item ", i, " out of order");
      window_.push_back(std::move(p));
      return &window_.back();
    }
    if (sched_.n_in_flight() > 0) {
      if (take_local()) continue;
      LFM2_CHECK(link_, "scheduler: item ", sched_.oldest_in_flight(), " never reported its tokens");
      take_reports(true);
      continue;
    }
    if (sched_.done() && source_done_) {
      if (link_ && !end_sent_) link_->send_end();
      end_sent_ = true;
      return nullptr;
    }
    if (!source_done_ && sched_.done()) {  // the prompts asked for are on their way
      if (waited_from < 0) waited_from = now_s();
      if (now_s() - waited_from > timeout_s_)
        LFM2_TIMEOUT("timed out after ", timeout_s_, " s waiting for prompts from rank 0 (see --timeout)");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    LFM2_FAIL("scheduler: nothing can run (", sched_.n_waiting(), " waiting, ", sched_.n_running(), " running, ",
              sched_.pages_in_use(), " pages in use)");
  }
}

const StepPlan* SchedulerFeed::held(int64_t i) const {
  return i >= base_ && i < base_ + int64_t(window_.size()) ? &window_[size_t(i - base_)] : nullptr;
}

void SchedulerFeed::release_before(int64_t i) {
  while (base_ < i - kKeepBehind && !window_.empty()) {
    window_.pop_front();
    ++base_;
  }
}

void SchedulerFeed::forward(int64_t i) {
  const StepPlan* p = held(i);
  LFM2_CHECK(p && link_, "scheduler: no plan of item ", i, " to send");
  link_->send_plan(*p);
}

void SchedulerFeed::chosen(int64_t i, const int32_t* tokens, int64_t n) { complete(i, tokens, n); }

// One stage with look-ahead: item i's tokens are read when the scheduler needs them (next()).
void SchedulerFeed::reported(int64_t i, const int32_t* tokens, int64_t n, const Done& done) {
  if (!sched_.config().look_ahead) return PlanFeed::reported(i, tokens, n, done);
  local_.push_back({i, tokens, n, done});
}

void SchedulerFeed::finish() {
  if (link_) link_->flush();
}

// The item's prompt rows (entry order) and fed tokens into ring buffer item % (P + 1).
StagedInput SchedulerFeed::stage(const StepPlan& plan) {
  const size_t k = size_t(plan.item % int64_t(staging_.ids.size()));
  int32_t* ids = staging_.ids[k];
  int64_t at = 0;
  for (const SeqRows& s : plan.seqs) {
    if (s.decode) continue;
    const auto it = prompts_.find(s.seq);
    LFM2_CHECK(it != prompts_.end() && s.first_pos + s.n_rows <= int64_t(it->second.size()), "scheduler: ",
               plan.name(), ": no prompt rows for sequence ", s.seq);
    LFM2_CHECK(at + s.n_rows <= sched_.config().max_batched_tokens, "scheduler: ", plan.name(), " over its budget");
    std::memcpy(ids + at, it->second.data() + s.first_pos, size_t(s.n_rows) * 4);
    at += s.n_rows;
  }
  std::copy(plan.fed.begin(), plan.fed.end(), staging_.fed[k]);
  return {at ? ids : nullptr, plan.fed.empty() ? nullptr : staging_.fed[k]};
}

ContinuousJob::ContinuousJob(const WorldConfig& pipe, StageExecutor& exec, const ContinuousShape& shape,
                             const SamplingParams& sampling, double timeout_s)
    : pipe_(pipe), exec_(exec), shape_(shape), sampling_(sampling), timeout_s_(timeout_s) {
  LFM2_CHECK(exec_.act_dtype() == DType::F32, "generation: hidden states must be fp32 (the decode flags are)");
  // LFM2_NO_LOOK_AHEAD=1: each item planned once the one before is done (to measure what it buys).
  if (env_choice("LFM2_NO_LOOK_AHEAD", "0", {"0", "1"}) == "1") shape_.look_ahead = false;
  exec_.alloc_batch_state(shape_.state, sampling_);
  if (pipe_.size > 1) link_ = std::make_unique<PlanLink>(pipe_, timeout_s);
  // Items in flight at once: one a stage, one more with look-ahead (one stage: the first is the
  // last, and an item's chosen tokens stay on its device for the next).
  const int flight = pipe_.size + (look_ahead() ? 1 : 0);
  if (pipe_.is_first())
    for (int k = 0; k <= flight; ++k) {
      staging_.ids.push_back(static_cast<int32_t*>(exec_.alloc_host(shape_.max_batched_tokens * 4)));
      staging_.fed.push_back(static_cast<int32_t*>(exec_.alloc_host(shape_.state.n_slots * 4)));
    }
  if (pipe_.is_last()) {
    memory_.spare_tokens = exec_.alloc_tokens(shape_.state.n_slots);
    for (int k = 0; k <= flight; ++k)
      memory_.report_tokens.push_back(static_cast<int32_t*>(exec_.alloc_host(shape_.state.n_slots * 4)));
  }
  if (look_ahead()) memory_.fed_tokens = exec_.alloc_tokens(shape_.state.n_slots);
}

void ContinuousJob::prepare(PromptSource* source, SchedulerFeed::Sink sink, SchedulerFeed::Idle idle) {
  memory_.staging = nullptr;
  sched_feed_ = nullptr;
  feed_.reset();
  if (!pipe_.is_first()) {
    feed_ = std::make_unique<LinkFeed>(*link_, pipe_.is_last());
    return;
  }
  LFM2_CHECK(source, "generation: the first stage needs its prompts");
  SchedulerConfig c;
  c.max_seqs = shape_.state.n_slots;
  c.max_batched_tokens = shape_.max_batched_tokens;
  c.admit_wave = shape_.admit_wave;
  c.prefill_first = shape_.prefill_first;
  c.n_pages = shape_.state.n_pages;
  c.page_size = shape_.state.page_size;
  c.max_pages = shape_.state.max_pages;
  c.max_in_flight = pipe_.size;
  c.look_ahead = look_ahead();
  c.eos = sampling_.eos;
  c.per_sequence_sampling = shape_.per_sequence_sampling;
  if (stream_)
    c.on_token = [](int64_t seq, int32_t token, bool ended) {
      log_event(ended ? cat("{\"seq\": ", seq, ", \"done\": true}") : cat("{\"seq\": ", seq, ", \"token\": ", token, "}"));
    };
  auto feed = std::make_unique<SchedulerFeed>(c, link_.get(), staging_, *source, std::move(sink), std::move(idle),
                                              timeout_s_);
  sched_feed_ = feed.get();
  memory_.staging = feed.get();
  feed_ = std::move(feed);
}

}  // namespace lfm2
