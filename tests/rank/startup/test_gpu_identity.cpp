// The shared-GPU check: two ranks reporting one GPU UUID stop the job, naming both.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/error.h"
#include "rank/startup/gpu_identity.h"

namespace lfm2 {
namespace {

GpuFacts gpu(int device, unsigned char uuid_byte, const char* host) {
  GpuFacts g;
  g.ok = 1;
  g.device = device;
  std::memset(g.uuid, uuid_byte, sizeof g.uuid);
  std::snprintf(g.host, sizeof g.host, "%s", host);
  std::snprintf(g.name, sizeof g.name, "NVIDIA H200");
  return g;
}

TEST(GpuIdentity, DistinctGpusPass) {
  EXPECT_NO_THROW(check_distinct_gpus({gpu(0, 1, "a"), gpu(1, 2, "a"), gpu(0, 3, "b"), gpu(1, 4, "b")}));
}

TEST(GpuIdentity, SharedGpuNamesBothRanksAndHosts) {
  try {
    check_distinct_gpus({gpu(0, 1, "a"), gpu(1, 2, "a"), gpu(0, 2, "a")});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ranks 1 and 2 would share one GPU"), std::string::npos) << msg;
    EXPECT_NE(msg.find("device 1 on a and device 0 on a"), std::string::npos) << msg;
  }
}

TEST(GpuIdentity, RanksWithoutAGpuAreIgnored) {
  GpuFacts none;  // ok = 0: that rank reports its own error instead
  EXPECT_NO_THROW(check_distinct_gpus({gpu(0, 1, "a"), none, none}));
}

}  // namespace
}  // namespace lfm2
