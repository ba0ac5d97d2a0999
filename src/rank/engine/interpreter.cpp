// What both interpreters share (interpreter.h): the items in order, each instruction's transport
// calls, and the transfers in flight.
#include "rank/engine/interpreter.h"

#include <algorithm>
#include <csignal>
#include <iterator>

#include "common/clock.h"
#include "common/error.h"
#include "rank/engine/nvtx_range.h"

namespace lfm2 {
namespace {

// MPI guarantees tags up to 32767; messages between two ranks do not overtake, so a wrapped tag is
// still unambiguous.
int tag_of(int64_t item) { return int(item % 32767); }

// Arms the watchdog (if any) while one item is queued; disarms it however the scope ends.
struct QueueGuard {
  Watchdog* w;
  QueueGuard(Watchdog* watchdog, const StepPlan& plan, double timeout_s) : w(watchdog) {
    if (w)
      w->arm(cat("queueing ", plan.name(), " on the GPU"), timeout_s,
             "the host was held inside a CUDA call (one that waits for the whole device, behind a transfer "
             "that cannot finish?)");
  }
  ~QueueGuard() {
    if (w) w->disarm();
  }
};

}  // namespace

StageInterpreter::StageInterpreter(StageParts& parts, PlanFeed& feed, const StepMemory& memory)
    : p_(parts),
      transport_(*parts.transport),
      exec_(*parts.exec),
      single_stage_(parts.world.size == 1),
      feed_(feed),
      memory_(memory),
      B_(int(parts.buffers.size())),
      first_(parts.world.is_first()),
      last_(parts.world.is_last()),
      recv_h_(size_t(B_), Transport::kNone),
      send_h_(size_t(B_), Transport::kNone) {}

StageTiming StageInterpreter::run(std::vector<TraceSpan>* trace) {
  origin_ = now_s();
  start();
  for (int64_t i = 0;; ++i) {
    const double t_plan = now_s();
    const StepPlan* plan = feed_.next(i);
    if (!plan) break;
    if (now_s() - t_plan > 1e-4) host_span("wait plan", i, t_plan);
    LFM2_CHECK(plan->item == i, "pipeline: plan ", i, " is item ", plan->item);
    const double t_queue = now_s();
    {
      NvtxRange range("queue item");
      const QueueGuard guard(p_.queue_guard.get(), *plan, transport_.timeout_s());
      for (StageOp op : item_program(*plan, first_, last_, feed_.travels())) execute(op, i);
    }
    queued(i, t_queue);
    feed_.release_before(i - B_ - 1);
    if (i == p_.kill_after) std::raise(p_.kill_signal);
  }
  finish();
  feed_.finish();
  StageTiming t;
  t.wall_s = now_s() - (t_first_ < 0 ? origin_ : t_first_);
  t.busy_s = busy_s();
  if (p_.tracing) {
    add_spans();
    std::stable_sort(trace_.begin(), trace_.end(), [](const TraceSpan& a, const TraceSpan& b) {
      return a.track != b.track ? a.track < b.track : a.begin_s < b.begin_s;
    });
    *trace = std::move(trace_);
  }
  return t;
}

void StageInterpreter::execute(StageOp op, int64_t i) {
  const StepPlan& plan = plan_of(i);
  switch (op) {
    case StageOp::kSendPlan: return feed_.forward(i);
    case StageOp::kFreeBuffer: return free_buffer(i);
    case StageOp::kRecvFeedback: return recv_feedback(i);
    case StageOp::kRecv: return recv(i);
    case StageOp::kPostAhead: return post_ahead(i);
    case StageOp::kInput:
    case StageOp::kLayers:
    case StageOp::kOutput: {
      void* x = p_.buffers[size_t(buffer_of(i))];
      first_work();
      return compute(step_name(op, plan.kind), i, [&] { run_step(op, plan, x, exec_, memory_); });
    }
    case StageOp::kFreeFeedbackSlot: return free_feedback_slot(i);
    case StageOp::kSendFeedback: return send_feedback(i);
    case StageOp::kSend: return send(i);
    case StageOp::kReport: return report(i);
    case StageOp::kRelease: return release_done();
  }
}

const StepPlan& StageInterpreter::plan_of(int64_t i) const {
  const StepPlan* p = feed_.held(i);
  LFM2_CHECK(p, "pipeline: the plan of item ", i, " is not held");
  return *p;
}

std::string StageInterpreter::name_of(int64_t i) const {
  const StepPlan* p = feed_.held(i);
  return p ? p->name() : cat("item ", i);
}

size_t StageInterpreter::bytes_of(const StepPlan& plan, int64_t i) const {
  const size_t b = item_bytes(plan, p_.hidden, exec_.act_dtype());
  LFM2_CHECK(b <= p_.buffer_bytes, "pipeline: item ", i, " of ", b, " bytes, buffers of ", p_.buffer_bytes);
  return b;
}

// First stage: buffer i % B is free to embed into once the send out of it (item i - B) is done.
void StageInterpreter::free_buffer(int64_t i) {
  const int b = buffer_of(i);
  if (send_h_[size_t(b)] != Transport::kNone) after(send_h_[size_t(b)], "wait send", i - B_);
  send_h_[size_t(b)] = Transport::kNone;
}

// First stage: the feedback item i embeds (the last stage's chosen tokens of an earlier item),
// received into its slot, whose last reader (an earlier input) has been queued.
void StageInterpreter::recv_feedback(int64_t i) {
  const StepPlan& plan = plan_of(i);
  const int64_t src = plan.feedback_from;
  const Handle h = transport_.irecv(feedback_tokens(memory_, plan.feedback_slot), feedback_bytes(plan_of(src)),
                                    p_.world.size - 1, tag_of(src), Transport::kNone);
  pending_.push_back({h, src, Kind::kFeedbackRecv, false, now_s()});
  after(h, "wait feedback", src);
}

// Receives are posted up to item i; the compute of i follows its receive.
void StageInterpreter::recv(int64_t i) {
  const int b = buffer_of(i);
  while (next_recv_ <= i) post_recv(next_recv_++);
  const Handle h = recv_h_[size_t(b)];
  recv_h_[size_t(b)] = Transport::kNone;
  after(h, "wait recv", i);
  first_work();
}

// The receives of i+1 .. i+B-1 that can start now, so that they overlap i's compute. Never one
// whose item needs feedback from an item this rank has yet to queue (generation with fewer
// microbatches than buffers): on a GPU its NCCL kernel would spin for data that only this host's
// next steps can release, and any CUDA call that waits for the whole device (loading a kernel's
// module on first use does) would then wait forever.
void StageInterpreter::post_ahead(int64_t i) {
  while (next_recv_ < i + B_) {
    const StepPlan* plan = feed_.ahead(next_recv_);
    if (!plan || plan->feedback_from >= i) return;
    if (!may_post_ahead(send_h_[size_t(buffer_of(next_recv_))])) return;
    post_recv(next_recv_++);
  }
}

// Starts receiving item j into buffer j % B, whose last reader (item j - B) has been queued.
void StageInterpreter::post_recv(int64_t j) {
  const StepPlan* plan = feed_.held(j);
  if (!plan) plan = feed_.ahead(j);
  LFM2_CHECK(plan, "pipeline: no plan for item ", j, " to receive");
  const int b = buffer_of(j);
  const Handle last_send = send_h_[size_t(b)];
  send_h_[size_t(b)] = Transport::kNone;
  const Handle after_send = receive_after(last_send, j - B_);
  const Handle h = transport_.irecv(p_.buffers[size_t(b)], bytes_of(*plan, j), p_.world.prev(), tag_of(j), after_send);
  recv_h_[size_t(b)] = h;
  pending_.push_back({h, j, Kind::kRecv, false, now_s()});
}

// Last stage: the slot's last send must be done before the output rewrites it.
void StageInterpreter::free_feedback_slot(int64_t i) {
  const auto it = fb_send_h_.find(plan_of(i).feeds_slot);
  if (it == fb_send_h_.end()) return;
  const Handle h = it->second;
  fb_send_h_.erase(it);
  after(h, "wait feedback send", i);
}

void StageInterpreter::send_feedback(int64_t i) {
  const StepPlan& plan = plan_of(i);
  const Handle h = transport_.isend(feedback_tokens(memory_, plan.feeds_slot), feedback_bytes(plan), 0, tag_of(i));
  fb_send_h_[plan.feeds_slot] = h;
  pending_.push_back({h, i, Kind::kFeedbackSend, false, now_s()});
}

void StageInterpreter::send(int64_t i) {
  const int b = buffer_of(i);
  const Handle h = transport_.isend(p_.buffers[size_t(b)], bytes_of(plan_of(i), i), p_.world.next(), tag_of(i));
  send_h_[size_t(b)] = h;
  pending_.push_back({h, i, Kind::kSend, false, now_s()});
}

// Last stage: the item's chosen tokens, once on this host, to the feed (the first stage's
// scheduler): the scheduler cannot plan these sequences' next rows from the host without them. The
// feed waits for them now (by default), or, planning ahead, when it needs them.
void StageInterpreter::report(int64_t i) {
  const StepPlan& plan = plan_of(i);
  feed_.reported(i, report_tokens(memory_, i), plan.n_emit(), item_done(i));
}

// Releases the transfers at the front of the queue that have completed (a test, never a wait).
// A receive is released only once the compute has been ordered after it.
void StageInterpreter::release_done() {
  while (!pending_.empty()) {
    const Pending& q = pending_.front();
    if (!q.is_send() && !q.ordered) return;
    if (!transport_.test(q.h)) return;
    forget(q);
    pending_.erase(pending_.begin());
  }
}

// Waits for every transfer still pending, in the order they were posted, then for the compute.
void StageInterpreter::finish() {
  while (!pending_.empty()) {
    const Pending q = pending_.front();
    const double t0 = now_s();
    transport_.wait(q.h, name_of(q.item));
    host_span(q.is_send() ? "wait send" : "wait recv", q.item, t0);
    forget(q);
    pending_.erase(pending_.begin());
  }
  finished();
}

// Waits for one pending operation (a send whose buffer is needed, or a receive whose data is),
// releasing it.
void StageInterpreter::wait_pending(Handle h, const char* name, int64_t item) {
  const auto it = find(h);
  const double t0 = now_s();
  transport_.wait(h, name_of(it->item));
  host_span(name, item, t0);
  forget(*it);
  pending_.erase(it);
}

// Tests one pending operation, releasing it when complete.
bool StageInterpreter::test_pending(Handle h) {
  const auto it = find(h);
  if (!transport_.test(h)) return false;
  forget(*it);
  pending_.erase(it);
  return true;
}

void StageInterpreter::mark_ordered(Handle h) {
  for (Pending& q : pending_)
    if (q.h == h) q.ordered = true;
}

std::vector<StageInterpreter::Pending>::iterator StageInterpreter::find(Handle h) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& q) { return q.h == h; });
  LFM2_CHECK(it != pending_.end(), "pipeline: transfer handle ", h, " is not pending");
  return it;
}

// A released handle may be reused by the transport: forget it everywhere.
void StageInterpreter::forget(const Pending& q) {
  for (std::vector<Handle>* v : {&send_h_, &recv_h_})
    for (Handle& h : *v)
      if (h == q.h) h = Transport::kNone;
  for (auto it = fb_send_h_.begin(); it != fb_send_h_.end();)
    it = it->second == q.h ? fb_send_h_.erase(it) : std::next(it);
  released(q);
}

void StageInterpreter::span(Track track, const char* name, int64_t item, double t0, double t1) {
  if (p_.tracing) trace_.push_back({track, name, item, t0 - origin_, t1 - origin_});
}

void StageInterpreter::host_span(const char* name, int64_t item, double t0) {
  span(Track::kHost, name, item, t0, now_s());
}

void StageInterpreter::first_work() {
  if (t_first_ < 0) t_first_ = now_s();
}

}  // namespace lfm2
