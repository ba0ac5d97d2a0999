// The device path (interpreter.h): CUDA executors over NCCL. The host only queues; order lives on
// the device, and the host waits once, at the end of the run.
#include "common/clock.h"
#include "common/error.h"
#include "rank/engine/interpreter.h"

namespace lfm2 {

void DeviceInterpreter::after(Handle h, const char* what, int64_t item) {
  (void)what, (void)item;
  transport_.order_compute_after(h);
  mark_ordered(h);
}

// The transport orders the receive after the send out of its buffer, on the device.
Transport::Handle DeviceInterpreter::receive_after(Handle send, int64_t send_item) {
  (void)send_item;
  return send;
}

bool DeviceInterpreter::may_post_ahead(Handle send) {
  (void)send;
  return true;
}

void DeviceInterpreter::compute(const char* name, int64_t item, const std::function<void()>& step) {
  timer_.begin(name, item);
  step();
  timer_.end();
}

// Every transfer it depended on has completed, so this cannot hang.
void DeviceInterpreter::finished() {
  const double t0 = now_s();
  exec_.synchronize();
  host_span("wait compute", -1, t0);
}

// The item's last step (its output) is the last the busy timer bracketed; a wait polls its event
// against --timeout.
PlanFeed::Done DeviceInterpreter::item_done(int64_t i) {
  const int64_t step = timer_.n_steps() - 1;
  return [this, i, step](bool wait) {
    if (!wait) return timer_.step_done(step);
    const double t0 = now_s();
    if (!poll_until([&] { return timer_.step_done(step); }, transport_.timeout_s()))
      LFM2_TIMEOUT("timed out after ", transport_.timeout_s(), " s waiting for the GPU to finish item ", i,
                   " (see --timeout)");
    host_span("wait tokens", i, t0);
    return true;
  };
}

// The GPU's own spans: compute steps from the busy timer's events, transfers from the transport's.
void DeviceInterpreter::add_spans() {
  for (TraceSpan& s : timer_.spans()) trace_.push_back(std::move(s));
  for (TraceSpan& s : transport_.transfer_spans()) trace_.push_back(std::move(s));
}

}  // namespace lfm2
