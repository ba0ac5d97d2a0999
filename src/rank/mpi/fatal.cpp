#include "rank/mpi/fatal.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "rank/mpi/world.h"

namespace lfm2 {
namespace {

// This rank's start-up errors since the last report, in order.
std::vector<std::string>& kept_errors() {
  static std::vector<std::string> errors;
  return errors;
}

// "0", "0-3", "0, 2, 5-7".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return s;
}

// "node-a" or "node-a, node-b": the distinct hosts of these ranks, in rank order.
std::string host_list(const WorldConfig& world, const std::vector<int>& ranks) {
  std::vector<std::string> seen;
  for (int r : ranks)
    if (!world.host_of(r).empty() && std::find(seen.begin(), seen.end(), world.host_of(r)) == seen.end())
      seen.push_back(world.host_of(r));
  std::string s;
  for (const auto& h : seen) s += (s.empty() ? "" : ", ") + h;
  return s;
}

}  // namespace

bool startup_step(const std::function<void()>& step, bool report) {
  try {
    step();
    return true;
  } catch (const TimeoutError&) {
    // Its collective is still pending on this rank while the others may have completed it: a next
    // agreement would pair with the wrong operations (MPI_ERR_TRUNCATE, garbled reports). The job
    // ends here (main's abort_job, which lets the rank that can name the stalled one speak).
    throw;
  } catch (const std::exception& e) {
    if (report) kept_errors().push_back(e.what());
    return false;
  }
}

std::vector<int64_t> allreduce_max(const WorldConfig& world, std::vector<int64_t> values, double timeout_s,
                                   const std::string& what) {
  barrier(world, timeout_s, what);  // a rank that never comes is named by rank 0 here
  std::vector<int64_t> out(values.size());
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(values.data(), out.data(), int(values.size()), MPI_INT64_T, MPI_MAX, world.comm, &req),
            what);
  wait_mpi_request(&req, timeout_s, what);
  return out;
}

bool all_ready(const WorldConfig& world, bool ok, double timeout_s, const std::string& what) {
  if (allreduce_max(world, {ok ? 0 : 1}, timeout_s, what)[0] == 0) return true;
  report_startup_errors(world, timeout_s);
  return false;
}

int report_startup_errors(const WorldConfig& world, double timeout_s) {
  std::vector<std::string> mine;
  mine.swap(kept_errors());
  std::vector<std::string> all;
  try {
    // replace: a message may quote a path that is not UTF-8
    const std::string text = nlohmann::json(mine).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    all = gather_strings(world, text, timeout_s, "gathering the start-up errors");
  } catch (const std::exception& e) {
    for (const auto& m : mine) log_error(m);  // nothing is lost when the gather itself fails
    abort_job(world, e);
  }
  if (!world.is_first()) return kExitError;
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < int(all.size()); ++r)
    for (const auto& m : nlohmann::json::parse(all[size_t(r)])) {
      const std::string msg = m.get<std::string>();
      auto& ranks = ranks_of[msg];
      if (ranks.empty()) order.push_back(msg);
      if (ranks.empty() || ranks.back() != r) ranks.push_back(r);
    }
  for (const auto& msg : order) {
    const auto& ranks = ranks_of[msg];
    // Across hosts, say where: a node that lacks a file is then named ("(on node-b)").
    const std::string on = world.multi_host() ? cat("on ", host_list(world, ranks)) : std::string();
    const std::string which = ranks.size() > 1 ? cat("ranks ", rank_list(ranks)) : std::string();
    const std::string where = which.empty() ? on : on.empty() ? which : cat(which, " ", on);
    log_error_as(cat("[rank ", ranks[0], "] "), where.empty() ? msg : cat(msg, " (", where, ")"));
  }
  return kExitError;
}

void abort_job(const WorldConfig&, const std::string& msg, int code) {
  log_error(msg);
  MPI_Abort(MPI_COMM_WORLD, code);  // the job, whichever communicator `world` is
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

void abort_job(const WorldConfig& world, const std::exception& e) {
  // MPI_Abort ends the job within a fraction of a second (a second or two across hosts), so of the
  // ranks that timed out the first to call it speaks alone; it should be one that names the stalled
  // rank. Each waits 0.25 s per place (at most 6 s), by its rank in the job. First rank 0 waiting on
  // all ranks (a barrier, an agreement, the stage times): it names every rank that did not arrive,
  // with its host, and sits on the node where mpirun prints. Then the ranks waiting on one peer: a
  // stall blocks the senders before it (the highest is its neighbour) and starves the receivers
  // after it (the lowest is), so receivers take the odd places from the bottom and senders the even
  // ones from the top. Last the other ranks waiting on all, which cannot tell whom they wait for.
  const auto* t = dynamic_cast<const TimeoutError*>(&e);
  if (t) {
    const int r = std::max(world.world_rank(world.rank), 0);
    const int n = world.world_ranks.empty() ? world.size : world.size * world.n_replicas;  // the job's ranks
    const int place = t->kind() == TimeoutKind::kReceive ? 1 + 2 * r
                      : t->kind() == TimeoutKind::kSend  ? 2 * (n - r)
                      : r == 0                           ? 0
                                                         : 2 * n + r;
    std::this_thread::sleep_for(std::chrono::duration<double>(0.25 * std::min(place, 24)));
  }
  // A rank's own failure names its replica (the whole job ends with it); a timeout names whom it
  // waited for instead.
  const std::string msg = world.n_replicas > 1 && !t ? cat("replica ", world.replica, ": ", e.what()) : e.what();
  abort_job(world, msg, dynamic_cast<const NonFiniteError*>(&e) ? kExitNonFinite : kExitAborted);
}

}  // namespace lfm2
