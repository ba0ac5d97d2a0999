// The start-up line of the run report (src/rank/report/startup_line.h) on made-up but realistic figures:
// four ranks on two hosts reading the tiny stages, one GPU rank reading the full model's stage.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "rank/report/startup_line.h"

namespace lfm2 {
namespace {

constexpr int64_t kT = 1763870400000000;  // a launch, microseconds since the epoch

WorldConfig two_hosts() {
  WorldConfig w;
  w.size = 4;
  w.host = "node-a";
  w.hosts = {"node-a", "node-a", "node-b", "node-b"};
  return w;
}

TEST(StartupReport, ReadRate) {
  EXPECT_EQ(read_rate(43725619, 71000), "41.7 MiB in 71 ms = 0.62 GB/s");
  // A full-model stage of 16.7 GB read (and uploaded) in 2.27 s.
  EXPECT_EQ(read_rate(16700000000, 2270000), "15.55 GiB in 2270 ms = 7.36 GB/s");
  EXPECT_EQ(read_rate(1000, 0), "0.0 MiB in 0 ms = 0.00 GB/s");
}

TEST(StartupReport, FourRanksOnTwoHosts) {
  const std::vector<StartupFacts> all = {{kT, 61000, 44249907},             // 0.73 GB/s
                                         {kT + 20000, 58000, 43411046},     // 0.75
                                         {kT + 310000, 71000, 43725619},    // 0.62, the last to start
                                         {kT + 150000, 70000, 51799654}};   // 0.74
  EXPECT_EQ(startup_line(two_hosts(), all, kT + 1840000),
            "start-up: first microbatch 1.84 s after launch (the first rank's process start; the last rank "
            "started 0.31 s after it: rank 2 on node-b); weights read at 0.62-0.75 GB/s per rank (slowest: "
            "rank 2 on node-b, 41.7 MiB in 71 ms = 0.62 GB/s)");
}

TEST(StartupReport, OneRankAndOneHost) {
  WorldConfig w;
  w.host = "gpu-1";
  w.hosts = {"gpu-1"};
  EXPECT_EQ(startup_line(w, {{kT, 2270000, 16700000000}}, kT + 9120000),
            "start-up: first microbatch 9.12 s after launch (the process start); weights read at 7.36 GB/s");
}

TEST(StartupReport, NoStartTimes) {
  WorldConfig w;
  w.size = 2;
  EXPECT_EQ(startup_line(w, {{-1, 1000000, 1000000000}, {-1, 500000, 1000000000}}, kT),
            "start-up: first microbatch at an unknown time after launch (no process start times); weights "
            "read at 1.00-2.00 GB/s per rank (slowest: rank 0, 953.7 MiB in 1000 ms = 1.00 GB/s)");
}

TEST(StartupReport, ThisProcessStartedBeforeNow) {
  const int64_t started = process_start_us(), now = wall_now_us();
  ASSERT_GT(started, 0);
  EXPECT_LE(started, now + 20000);        // clock ticks round to 10 ms
  EXPECT_GT(started, now - 3600000000);   // a test process younger than an hour
}

}  // namespace
}  // namespace lfm2
