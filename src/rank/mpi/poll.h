// poll_until(): the one polling loop behind every wait with a deadline (included by transport.h).
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace lfm2 {

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

}  // namespace lfm2
