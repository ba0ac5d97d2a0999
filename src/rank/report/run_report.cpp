#include "rank/report/run_report.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "rank/engine/schedule_chart.h"
#include "rank/mpi/fatal.h"
#include "rank/mpi/world.h"

namespace lfm2 {
namespace {

constexpr int kReportTag = 32767;
constexpr int kTimingTag = 32765;  // replica_results.cpp uses 32766

// "rank 3 (replica 1 stage 1), rank 5 (replica 2 stage 1)" (job ranks), with their hosts when the
// job spans several; with one replica "ranks 1-2" (world.h's name_ranks).
std::string rank_names(const WorldConfig& world, const std::vector<int>& ranks, const ReplicaLayout& layout) {
  if (layout.n_replicas == 1) return name_ranks(world, ranks);
  std::string s;
  for (const int r : ranks) {
    s += cat(s.empty() ? "" : ", ", "rank ", r, " (replica ", layout.replica_of[size_t(r)], " stage ",
             layout.stage_of[size_t(r)], ")");
    if (world.multi_host()) s += cat(" on ", world.host_of(r));
  }
  return s;
}

}  // namespace

// The last rank's report lines reach rank 0, which prints them.
void deliver_report(const WorldConfig& world, const std::vector<std::string>& lines, double timeout_s) {
  if (world.size == 1) {
    for (const auto& l : lines) log_info(l);
    return;
  }
  if (world.is_last()) {
    const std::string text = nlohmann::json(lines).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    MPI_Request req;
    MPI_CHECK(MPI_Isend(text.data(), int(text.size()), MPI_CHAR, 0, kReportTag, world.comm, &req),
              "sending the report");
    wait_mpi_request(&req, timeout_s, "sending the report to rank 0");
  } else if (world.is_first()) {
    MPI_Status st;
    int flag = 0;
    auto arrived = [&] {
      MPI_CHECK(MPI_Iprobe(world.size - 1, kReportTag, world.comm, &flag, &st), "waiting for the report");
      return flag != 0;
    };
    const double wait_s = unnamed_wait_s(world, timeout_s);
    if (!poll_until(arrived, wait_s))
      LFM2_TIMEOUT("timed out after ", wait_s, " s waiting for the last rank's report (",
                   world.rank_name(world.size - 1), "; see --timeout)");
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(size_t(n), '\0');
    MPI_CHECK(MPI_Recv(text.data(), n, MPI_CHAR, world.size - 1, kReportTag, world.comm, MPI_STATUS_IGNORE),
              "receiving the report");
    for (const auto& l : nlohmann::json::parse(text)) log_info(l.get<std::string>());
  }
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The run report of a plain run: each stage's busy time and the bubble, measured and GPipe's.
std::vector<std::string> pipeline_report(const std::vector<StageTiming>& timing, const std::vector<StageLayers>& stages,
                                         int64_t n_micro) {
  std::vector<std::string> lines;
  double wall = 0, busy = 0, lo = 1e300, hi = 0;
  for (const StageTiming& t : timing) {
    wall = std::max(wall, t.wall_s);
    busy += t.busy_s;
    lo = std::min(lo, t.busy_s);
    hi = std::max(hi, t.busy_s);
  }
  std::string busy_line = "pipeline: busy per stage";
  for (size_t r = 0; r < timing.size(); ++r)
    busy_line += cat(r ? ", " : " ", fixed(timing[r].busy_s, 4), " s (layers ", stages[r].layer_begin, "-",
                     stages[r].layer_end - 1, ")");
  lines.push_back(busy_line + cat("; spread ", fixed(hi > 0 ? 100 * (hi - lo) / hi : 0, 1), "%"));
  const int P = int(timing.size());
  lines.push_back(cat("pipeline: wall ", fixed(wall, 4), " s; bubble ",
                      fixed(wall > 0 ? 100 * (1 - busy / (P * wall)) : 0, 1), "% measured, GPipe ",
                      fixed(100 * gpipe_bubble(P, n_micro), 1), "% for ", n_micro, " microbatches"));
  return lines;
}

// Each rank's busy and wall time of one run, sent to rank 0 point to point, so that rank 0 can name
// the ranks that did not finish the run.
std::vector<StageTiming> gather_timing(const WorldConfig& world, const ReplicaLayout& layout, const StageTiming& mine,
                                       double timeout_s) {
  static_assert(sizeof(StageTiming) == 2 * sizeof(double), "StageTiming travels as two doubles");
  std::vector<StageTiming> all(size_t(world.size));
  if (!world.is_first()) {
    MPI_Request req;
    MPI_CHECK(MPI_Isend(&mine, 2, MPI_DOUBLE, 0, kTimingTag, world.comm, &req), "sending the stage times");
    wait_mpi_request(&req, timeout_s, "sending the stage times to rank 0");
    return all;
  }
  all[0] = mine;
  std::vector<MPI_Request> reqs(size_t(world.size), MPI_REQUEST_NULL);
  for (int r = 1; r < world.size; ++r)
    MPI_CHECK(MPI_Irecv(&all[size_t(r)], 2, MPI_DOUBLE, r, kTimingTag, world.comm, &reqs[size_t(r)]),
              "gathering stage times");
  auto done = [&] {
    int flag = 0;
    MPI_CHECK(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "gathering stage times");
    return flag != 0;
  };
  if (poll_until(done, timeout_s)) return all;
  std::vector<int> missing;
  for (int r = 1; r < world.size; ++r) {
    int flag = 0;
    MPI_Test(&reqs[size_t(r)], &flag, MPI_STATUS_IGNORE);
    if (!flag) missing.push_back(r);
  }
  LFM2_GROUP_TIMEOUT("timed out after ", timeout_s, " s gathering stage times: nothing from ",
                     rank_names(world, missing, layout), " (did a rank stop, or lose its link? see --timeout)");
}

std::string layer_counts(const std::vector<StageLayers>& stages) {
  std::string s;
  for (size_t i = 0; i < stages.size(); ++i) s += (i ? "," : "") + std::to_string(stages[i].n_layers());
  return s;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1 << 20));
  return buf;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / (1 << 30));
  return buf;
}

std::vector<std::string> replica_pipeline_report(const std::vector<StageTiming>& timing, const ReplicaLayout& layout,
                                                 const std::vector<ReplicaWork>& work,
                                                 const std::vector<StageLayers>& stages, int64_t steps) {
  if (layout.n_replicas == 1) return pipeline_report(timing, stages, work[0].n_micro() * steps);
  std::vector<std::string> lines;
  std::vector<double> wall(size_t(layout.n_replicas), 0);
  for (int r = 0; r < layout.n_replicas; ++r) {
    std::vector<StageTiming> mine;
    for (int rank : layout.ranks[size_t(r)]) mine.push_back(timing[size_t(rank)]);
    for (const StageTiming& t : mine) wall[size_t(r)] = std::max(wall[size_t(r)], t.wall_s);
    for (std::string& l : pipeline_report(mine, stages, work[size_t(r)].n_micro() * steps))
      lines.push_back(cat("pipeline: replica ", r, ": ", l.substr(std::string("pipeline: ").size())));
  }
  const auto slowest = std::max_element(wall.begin(), wall.end()), fastest = std::min_element(wall.begin(), wall.end());
  lines.push_back(cat("pipeline: replicas: the slowest (replica ", slowest - wall.begin(), ") ", fixed(*slowest, 4),
                      " s, the fastest (replica ", fastest - wall.begin(), ") ", fixed(*fastest, 4), " s: ",
                      fixed(*slowest > 0 ? 100 * (1 - *fastest / *slowest) : 0, 1), "% imbalance"));
  return lines;
}

}  // namespace lfm2
