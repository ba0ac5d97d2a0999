// Waits with a deadline: poll_until(), the one polling loop behind every wait for another rank (the
// transports, the collectives), and wait_mpi_request() for a non-blocking MPI collective.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace lfm2 {

// Polls `done()` with a short spin and then sleeps growing to 1 ms, until it returns true or
// `timeout_s` passes (then returns false).
template <typename Done>
bool poll_until(Done&& done, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s);
  for (int spin = 0; spin < 200; ++spin)
    if (done()) return true;
  // Sleeping rather than spinning leaves the cores to the compute threads of the other ranks.
  auto nap = std::chrono::microseconds(20);
  while (!done()) {
    if (clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
  return true;
}

// Waits for a non-blocking MPI collective (MPI_Iallreduce, ...) with a deadline; throws on timeout.
void wait_mpi_request(MPI_Request* req, double timeout_s, const std::string& what);

}  // namespace lfm2
