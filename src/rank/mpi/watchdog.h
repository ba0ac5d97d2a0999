// Watchdog: bounds the waits of lfm2-rank that cannot poll a deadline themselves.
//
// Every wait for another rank inside the run polls against --timeout (world.h's poll_until). A few blocking
// MPI calls cannot: MPI_Init_thread (a rank that never starts leaves the others in its exchange of
// addresses), the node-local communicator's split, and MPI_Finalize (a rank that stopped after the
// exit agreement). Around each of them main() arms this watchdog; a thread that sleeps until the
// deadline then prints one line, removes pending temporary files and ends the process with
// kExitAborted, and mpirun ends the rest of the job.
//
// Deadline: --timeout, but at least kMinMpiSeconds (MPI's own start and end take time even when no
// rank is late), plus 2 s per rank number (at most 6 s), so that, of several ranks left waiting on
// one that stopped, the lowest speaks and mpirun, which takes one to two seconds to notice a process
// that ended without MPI_Finalize, ends the others before they do.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace lfm2 {

class Watchdog {
 public:
  static constexpr double kMinMpiSeconds = 5;

  // `prefix` starts the line it prints ("[rank 2] ").
  Watchdog(std::string prefix, int rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // From now on, `what` ("MPI initialisation") must end within max(timeout_s, kMinMpiSeconds) plus
  // the rank's stagger; past it the line names `what` and then `cause`.
  static constexpr const char* kRankMissing = "a rank did not arrive (stopped or never started? see --timeout)";
  void arm(const std::string& what, double timeout_s, const std::string& cause = kRankMissing);
  // It ended in time.
  void disarm();

  // The extra time rank r waits before it speaks: 2 s per rank, at most 6 s.
  static double stagger_s(int rank);

 private:
  void watch();

  std::string prefix_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, stop_ = false;
  std::string what_, cause_;
  double timeout_s_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

// The rank that the launcher gives this process, read from its environment before MPI exists
// (Open MPI, MPICH / Hydra, PMIx, Slurm); 0 when none says.
int launcher_rank();

}  // namespace lfm2
