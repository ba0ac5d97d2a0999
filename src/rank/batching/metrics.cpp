#include "rank/batching/metrics.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "rank/report/run_report.h"
#include "common/pending_file.h"

namespace lfm2 {
namespace {

nlohmann::json to_json(const Quantiles& q) {
  return {{"mean", q.mean}, {"p50", q.p50}, {"p90", q.p90}, {"p99", q.p99}, {"max", q.max}, {"n", q.n}};
}

std::string ms(double s) { return fixed(1000 * s, 2) + " ms"; }

}  // namespace

Quantiles quantiles(std::vector<double> v) {
  Quantiles q;
  q.n = int64_t(v.size());
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  auto at = [&](double p) { return v[size_t(std::max<double>(0, std::ceil(p * double(v.size())) - 1))]; };
  double sum = 0;
  for (double x : v) sum += x;
  q.mean = sum / double(v.size());
  q.p50 = at(0.5);
  q.p90 = at(0.9);
  q.p99 = at(0.99);
  q.max = v.back();
  return q;
}

double memory_floor_s(const std::vector<FloorStage>& stages, const SchedulerStats& st) {
  double worst = 0;
  for (const FloorStage& s : stages) {
    if (s.bandwidth <= 0) return 0;
    worst = std::max(worst, (double(st.items) * s.weight_bytes + double(st.kv_positions) * s.kv_bytes_per_position) /
                                s.bandwidth);
  }
  return worst;
}

double slot_occupancy(const SchedulerStats& st, int64_t n_slots) {
  return st.items && n_slots ? double(st.slot_items) / double(st.items * n_slots) : 0;
}

RunMetrics run_metrics(const std::vector<FinishedSeq>& finished, const SchedulerStats& st, int64_t n_slots,
                       double wall_s) {
  RunMetrics m;
  m.wall_s = wall_s;
  std::vector<double> ttft, ttft_q, tpot, latency;
  for (const FinishedSeq& f : finished) {
    ++m.sequences;
    m.prompt_tokens += f.prompt_len;
    m.preemptions += f.preemptions;
    ttft.push_back(f.first_token_s);
    ttft_q.push_back(f.first_token_s - f.added_s);
    latency.push_back(f.finished_s);
    m.new_tokens += f.n_tokens;
    if (f.n_tokens >= 2) tpot.push_back((f.finished_s - f.first_token_s) / double(f.n_tokens - 1));
  }
  m.ttft_s = quantiles(ttft);
  m.ttft_from_queue_s = quantiles(ttft_q);
  m.tpot_s = quantiles(tpot);
  m.latency_s = quantiles(latency);
  m.itl_s = quantiles(st.token_gaps_s);
  m.prompt_items = st.prompt_items_back, m.decode_items = st.decode_items_back;
  m.prompt_items_s = st.prompt_items_s, m.decode_items_s = st.decode_items_s;
  m.steps = st.items;
  m.slots = n_slots;
  m.slot_occupancy = slot_occupancy(st, n_slots);
  return m;
}

std::vector<std::string> benchmark_lines(const RunMetrics& m, int64_t n_seq, int n_replicas) {
  std::vector<std::string> l;
  l.push_back(cat("benchmark: continuous generation of ", n_seq, " sequences", n_replicas > 1 ? cat(" on ", n_replicas, " replicas") : std::string(),
                  ": ", fixed(m.wall_s, 4), " s, ", m.new_tokens, " new tokens: ",
                  fixed(m.wall_s > 0 ? double(m.new_tokens) / m.wall_s : 0, 1), " tokens/s (",
                  fixed(m.wall_s > 0 ? double(m.prompt_tokens + m.new_tokens) / m.wall_s : 0, 1),
                  " with the prompts)"));
  l.push_back(cat("benchmark: time between tokens (per sequence) mean ", ms(m.tpot_s.mean), ", p50 ", ms(m.tpot_s.p50),
                  ", p99 ", ms(m.tpot_s.p99), "; time to first token p50 ", ms(m.ttft_s.p50), ", p99 ",
                  ms(m.ttft_s.p99)));
  if (m.itl_s.n > 0)
    l.push_back(cat("benchmark: inter-token latency (every token after a sequence's first, replica 0) mean ",
                    ms(m.itl_s.mean), ", p50 ", ms(m.itl_s.p50), ", p90 ", ms(m.itl_s.p90), ", p99 ",
                    ms(m.itl_s.p99), ", max ", ms(m.itl_s.max)));
  if (m.prompt_items + m.decode_items > 0) {
    auto each = [](double s, int64_t n) { return n > 0 ? ms(s / double(n)) : std::string("-"); };
    l.push_back(cat("benchmark: replica 0's steps as they came back: ", m.prompt_items, " with prompt rows in ",
                    fixed(m.prompt_items_s, 3), " s (", each(m.prompt_items_s, m.prompt_items), " each), ",
                    m.decode_items, " of decode rows alone in ", fixed(m.decode_items_s, 3), " s (",
                    each(m.decode_items_s, m.decode_items), " each)"));
  }
  l.push_back(cat("benchmark: ", m.steps, " steps on replica 0, slot occupancy ", fixed(100 * m.slot_occupancy, 1),
                  "% of ", m.slots, ", ", m.preemptions, " preemptions"));
  if (m.floor_s > 0)
    l.push_back(cat("benchmark: memory floor (each step's weights and cached KV read at the copy bandwidth) ",
                    fixed(m.floor_s, 4), " s: ", fixed(100 * m.floor_s / m.wall_s, 1), "% of the wall time"));
  return l;
}

void write_metrics(const std::string& path, const RunMetrics& m) {
  const nlohmann::json j = {
      {"format", "lfm2-rank-metrics-1"},
      {"wall_s", m.wall_s},
      {"sequences", m.sequences},
      {"prompt_tokens", m.prompt_tokens},
      {"new_tokens", m.new_tokens},
      {"throughput_tokens_per_s", m.wall_s > 0 ? double(m.new_tokens) / m.wall_s : 0},
      {"throughput_with_prompts_tokens_per_s", m.wall_s > 0 ? double(m.prompt_tokens + m.new_tokens) / m.wall_s : 0},
      {"time_to_first_token_s", to_json(m.ttft_s)},
      {"time_to_first_token_from_queue_s", to_json(m.ttft_from_queue_s)},
      {"time_per_output_token_s", to_json(m.tpot_s)},
      {"inter_token_latency_s", to_json(m.itl_s)},
      {"prompt_steps_replica0", {{"n", m.prompt_items}, {"s", m.prompt_items_s}}},
      {"decode_steps_replica0", {{"n", m.decode_items}, {"s", m.decode_items_s}}},
      {"latency_s", to_json(m.latency_s)},
      {"steps_replica0", m.steps},
      {"slots", m.slots},
      {"slot_occupancy_replica0", m.slot_occupancy},
      {"preemptions", m.preemptions},
      {"memory_floor_s", m.floor_s},
      {"memory_floor_fraction", m.wall_s > 0 ? m.floor_s / m.wall_s : 0}};
  PendingFile file(path);
  {
    std::ofstream f(file.tmp_path());
    f << j.dump(2) << "\n";
    LFM2_CHECK(f.good(), path, ": cannot write the metrics");
  }
  file.commit();
  log_info("metrics: wrote " + path);
}

}  // namespace lfm2
