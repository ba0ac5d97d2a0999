#include "rank/report/trace_file.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/pending_file.h"

#if defined(LFM2_HAVE_NVTX) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define LFM2_NVTX 1
#endif

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
  PendingFile file(path);
  {
    std::ofstream out(file.tmp_path(), std::ios::binary | std::ios::trunc);
    LFM2_CHECK(out.good(), path, ": cannot write the trace");
    out << "{\"displayTimeUnit\": \"ms\", \"otherData\": " << (meta_json.empty() ? "{}" : meta_json)
        << ",\n\"traceEvents\": [\n";
    bool first = true;
    for (const std::string& events : rank_events) {
      if (events.empty()) continue;
      out << (first ? "" : ",\n") << events;
      first = false;
    }
    out << "\n]}\n";
    out.flush();
    LFM2_CHECK(out.good(), path, ": writing the trace failed");
  }
  file.commit();
}

#ifdef LFM2_NVTX
NvtxRange::NvtxRange(const char* name) { nvtxRangePushA(name); }
NvtxRange::~NvtxRange() { nvtxRangePop(); }
#else
NvtxRange::NvtxRange(const char*) {}
NvtxRange::~NvtxRange() {}
#endif

}  // namespace lfm2
