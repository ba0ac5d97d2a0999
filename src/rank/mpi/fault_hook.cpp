#include "rank/mpi/fault_hook.h"

#include <csignal>
#include <cstdlib>
#include <string>

namespace lfm2 {

void fault_point(int rank, const char* phase) {
  const char* env = std::getenv("LFM2_TEST_KILL");
  if (!env) return;
  const std::string spec = env;
  const size_t a = spec.find(':');
  if (a == std::string::npos || spec.substr(0, a) != std::to_string(rank)) return;
  const size_t b = spec.find(':', a + 1);
  if (spec.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1) != phase) return;
  std::raise(b != std::string::npos && spec.substr(b + 1) == "stop" ? SIGSTOP : SIGKILL);
}

}  // namespace lfm2
