// The host path (interpreter.h): CPU executors over MPI. Every wait is a wait; compute runs on a
// worker thread while this (the MPI) thread keeps the transfers moving.
#include <chrono>
#include <future>

#include "common/clock.h"
#include "rank/engine/interpreter.h"

namespace lfm2 {

void HostInterpreter::after(Handle h, const char* what, int64_t item) { wait_pending(h, what, item); }

Transport::Handle HostInterpreter::receive_after(Handle send, int64_t send_item) {
  if (send != Transport::kNone) wait_pending(send, "wait send", send_item);
  return Transport::kNone;
}

// Only into a buffer whose last send has completed (tested, not waited for).
bool HostInterpreter::may_post_ahead(Handle send) { return send == Transport::kNone || test_pending(send); }

// With a single stage there is nothing to move and the step runs inline.
void HostInterpreter::compute(const char* name, int64_t item, const std::function<void()>& step) {
  const double t0 = now_s();
  if (single_stage_) {
    step();
    exec_.synchronize();
  } else {
    auto done = std::async(std::launch::async, [&] {
      step();
      exec_.synchronize();
    });
    while (done.wait_for(std::chrono::microseconds(200)) != std::future_status::ready) transport_.progress();
    done.get();  // rethrows a compute error here
  }
  const double t1 = now_s();
  busy_s_ += t1 - t0;
  span(Track::kCompute, name, item, t0, t1);
}

// Every step ran to completion where it was called.
PlanFeed::Done HostInterpreter::item_done(int64_t i) {
  (void)i;
  return [](bool) { return true; };
}

// A transfer's span as the host saw it: posted to found complete.
void HostInterpreter::released(const Pending& q) {
  const bool feedback = q.kind == Kind::kFeedbackRecv || q.kind == Kind::kFeedbackSend;
  const char* name = feedback ? (q.is_send() ? "feedback send" : "feedback recv") : (q.is_send() ? "send" : "recv");
  span(q.is_send() ? Track::kSend : Track::kRecv, name, q.item, q.posted_s, now_s());
}

}  // namespace lfm2
