// A run's timeline: spans of compute, transfers and host waits on each rank, written as one Chrome
// trace-event JSON file (Perfetto and chrome://tracing open it; tools/trace_gantt.py draws it).
//
// Each rank records its spans in seconds from its own origin: the start of the traced run, taken
// right after a barrier, so ranks line up to within the barrier's skew. GPU spans come from CUDA
// events on the compute and communication streams (the GPU's own clock, converted to the same
// origin); host spans from the host's steady clock. Rank 0 gathers every rank's events and writes
// the file whole or not at all (PendingFile). One process per rank ("rank 2: layers 12-17"), one
// thread per track (compute, recv, send, host).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/layer_partition.h"
#include "rank/engine/pipeline.h"
#include "rank/mpi/world.h"
#include "rank/transport/trace_span.h"

namespace lfm2 {

// The trace-event objects of one rank (a JSON array's elements, comma-separated, no brackets):
// metadata naming the process and its tracks, then one complete ("X") event per span, with
// timestamps in microseconds.
std::string trace_events_json(int rank, const std::string& label, const std::vector<TraceSpan>& spans);

// Writes {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": meta} from every rank's
// trace_events_json() atomically to `path`.
void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events,
                      const std::string& meta_json);

// Every rank's trace events to rank 0, which writes `path` (whole or not at all) with `meta` (the
// job's shape) as its otherData (each rank of the job, `world`, calls it; with replicas each
// process is labelled with its replica and stage). A write that fails (a full disk) is rank 0's error
// alone: it is logged with its cause and returned as exit 1, for the job to end together, as a
// failed --output does; the other ranks return 0.
int deliver_trace(const WorldConfig& world, const Pipeline& pipeline, const std::vector<StageLayers>& stages,
                   const std::string& path, const nlohmann::json& meta, double timeout_s);

}  // namespace lfm2
