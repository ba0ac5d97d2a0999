#include "rank/report/trace_file.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "common/pending_file.h"
#include "rank/mpi/fatal.h"
#include "rank/report/run_report.h"

namespace lfm2 {
namespace {

const char* track_name(Track t) {
  switch (t) {
    case Track::kCompute: return "compute";
    case Track::kRecv: return "recv";
    case Track::kSend: return "send";
    case Track::kHost: return "host";
  }
  return "?";
}

}  // namespace

std::string trace_events_json(int rank, const std::string& label, const std::vector<TraceSpan>& spans) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", label}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  for (Track t : {Track::kCompute, Track::kRecv, Track::kSend, Track::kHost}) {
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", int(t)}, {"args", {{"name", track_name(t)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", int(t)},
                      {"args", {{"sort_index", int(t)}}}});
  }
  for (const TraceSpan& s : spans) {
    nlohmann::json e = {{"ph", "X"},
                        {"name", s.micro >= 0 ? s.name + " m" + std::to_string(s.micro) : s.name},
                        {"cat", track_name(s.track)},
                        {"pid", rank},
                        {"tid", int(s.track)},
                        {"ts", s.begin_s * 1e6},
                        {"dur", std::max(0.0, s.end_s - s.begin_s) * 1e6}};
    if (s.micro >= 0) e["args"] = {{"microbatch", s.micro}};
    events.push_back(std::move(e));
  }
  std::string text = events.dump();
  return text.size() <= 2 ? std::string() : text.substr(1, text.size() - 2);  // the elements only
}

void write_trace_file(const std::string& path, const std::vector<std::string>& rank_events,
                      const std::string& meta_json) {
  std::string text = "{\"displayTimeUnit\": \"ms\", \"otherData\": " + (meta_json.empty() ? "{}" : meta_json) +
                     ",\n\"traceEvents\": [\n";
  bool first = true;
  for (const std::string& events : rank_events) {
    if (events.empty()) continue;
    text += (first ? "" : ",\n") + events;
    first = false;
  }
  text += "\n]}\n";
  write_whole_file(path, text);
}

// Every rank's trace events to rank 0, which writes the file (whole or not at all).
int deliver_trace(const WorldConfig& world, const Pipeline& pipeline, const std::vector<StageLayers>& stages,
                   const std::string& path, const nlohmann::json& meta, double timeout_s) {
  const WorldConfig& pipe = pipeline.world();  // this rank's stage of its replica
  const StageLayers& p = stages[size_t(pipe.rank)];
  const std::string label = cat("rank ", world.rank,
                                pipe.n_replicas > 1 ? cat(" (replica ", pipe.replica, " stage ", pipe.rank, ")") : "",
                                ": layers ", p.layer_begin, "-", p.layer_end - 1,
                                world.size > 1 ? cat(" on ", world.host) : std::string());
  const std::vector<std::string> all = gather_strings(world, trace_events_json(world.rank, label, pipeline.trace()),
                                                      timeout_s, "gathering the trace");
  if (!world.is_first()) return kExitOk;
  nlohmann::json m = meta;
  m["tool"] = "lfm2-rank";
  m["ranks"] = world.size;
  m["created"] = utc_now();
  try {
    write_trace_file(path, all, m.dump());
  } catch (const std::exception& e) {
    log_error(cat("--trace ", e.what()));
    return kExitError;
  }
  log_info(cat("trace: wrote ", path, " (", pipeline.trace().size(), " spans on rank 0; open it in Perfetto or ",
               "draw it with tools/trace_gantt.py)"));
  return kExitOk;
}

}  // namespace lfm2
