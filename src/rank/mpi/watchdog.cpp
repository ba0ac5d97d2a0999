#include "rank/mpi/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/pending_file.h"
#include "rank/mpi/fatal.h"

namespace lfm2 {

Watchdog::Watchdog(std::string prefix, int rank) : prefix_(std::move(prefix)), rank_(rank) {
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

double Watchdog::stagger_s(int rank) { return 2.0 * std::min(std::max(rank, 0), 3); }

void Watchdog::arm(const std::string& what, double timeout_s, const std::string& cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    what_ = what;
    cause_ = cause;
    timeout_s_ = std::max(timeout_s, kMinMpiSeconds);
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(timeout_s_ + stagger_s(rank_)));
  }
  cv_.notify_all();
}

void Watchdog::disarm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }
  cv_.notify_all();
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, deadline_) != std::cv_status::timeout) continue;  // re-armed, disarmed or stopped
    if (!armed_ || stop_ || std::chrono::steady_clock::now() < deadline_) continue;
    // The main thread is stuck inside a call it cannot leave (MPI, a CUDA call): say so in one line
    // and end this process; mpirun then ends the others.
    std::fflush(stdout);
    std::fprintf(stderr, "%serror: timed out after %g s in %s: %s\n", prefix_.c_str(), timeout_s_, what_.c_str(),
                 cause_.c_str());
    std::fflush(stderr);
    remove_pending_files_now();
    std::_Exit(kExitAborted);
  }
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return 0;
}

}  // namespace lfm2
