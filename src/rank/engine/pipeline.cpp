#include "rank/engine/pipeline.h"

#include "common/error.h"
#include "common/log.h"

namespace lfm2 {

Pipeline::Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, int64_t hidden,
                   int64_t max_item_tokens) {
  LFM2_CHECK(max_item_tokens > 0, "pipeline: empty items");
  LFM2_CHECK(!exec.on_device() || transport.accepts_device_memory(), "the ", transport.name(),
             " transport cannot move device buffers");
  parts_.world = world;
  parts_.exec = &exec;
  parts_.transport = &transport;
  parts_.hidden = hidden;
  parts_.buffer_bytes = size_t(max_item_tokens * hidden) * dtype_size(exec.act_dtype());
  const int n_buf = world.size == 1 ? 1 : 3;
  for (int b = 0; b < n_buf; ++b) parts_.buffers.push_back(exec.alloc_hidden(max_item_tokens));
  if (exec.on_device()) parts_.queue_guard = std::make_unique<Watchdog>(log_prefix(), world.rank);
}

void Pipeline::set_tracing(bool on) {
  parts_.tracing = on;
  parts_.transport->set_tracing(on);
}

StageTiming Pipeline::run(const std::vector<StepPlan>& schedule, const StepMemory& memory) {
  for (size_t i = 0; i < schedule.size(); ++i)
    LFM2_CHECK(schedule[i].item == int64_t(i), "pipeline: plan ", i, " is item ", schedule[i].item);
  StaticFeed feed(schedule);
  return run(feed, memory);
}

StageTiming Pipeline::run(PlanFeed& feed, const StepMemory& memory) {
  if (parts_.exec->on_device() && parts_.timer) return DeviceInterpreter(parts_, feed, memory).run(&trace_);
  return HostInterpreter(parts_, feed, memory).run(&trace_);
}

}  // namespace lfm2
