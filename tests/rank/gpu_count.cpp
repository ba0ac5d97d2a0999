// gpu_count: prints how many GPUs this process sees (0 without a driver); gpu_run.sh skips on it.
#include <cstdio>

#include "rank/startup/gpu_info.h"

int main() {
  std::printf("%d\n", lfm2::visible_gpu_count());
  return 0;
}
