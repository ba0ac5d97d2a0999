#include "rank/report/startup_line.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/error.h"

namespace lfm2 {
namespace {

double seconds_of(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

std::string fmt(const char* f, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double gb_per_s(int64_t bytes, int64_t us) { return us > 0 ? double(bytes) / double(us) / 1e3 : 0; }

}  // namespace

int64_t process_start_us() {
  std::ifstream in("/proc/self/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return -1;
  // Field 22, starttime (clock ticks after boot); after the name come fields 3, 4, ...
  std::istringstream rest(stat.substr(close + 1));
  std::string skip;
  for (int field = 3; field < 22; ++field) rest >> skip;
  unsigned long long ticks = 0;
  if (!(rest >> ticks)) return -1;
  const double boot = seconds_of(CLOCK_REALTIME) - seconds_of(CLOCK_BOOTTIME);
  return int64_t((boot + double(ticks) / double(sysconf(_SC_CLK_TCK))) * 1e6);
}

int64_t wall_now_us() { return int64_t(seconds_of(CLOCK_REALTIME) * 1e6); }

std::string read_rate(int64_t bytes, int64_t us) {
  const std::string size = bytes < (int64_t(1) << 30) ? fmt("%.1f MiB", double(bytes) / double(1 << 20))
                                                      : fmt("%.2f GiB", double(bytes) / double(1 << 30));
  return cat(size, " in ", (us + 500) / 1000, " ms = ", fmt("%.2f", gb_per_s(bytes, us)), " GB/s");
}

std::string startup_line(const WorldConfig& world, const std::vector<StartupFacts>& all, int64_t first_micro_us) {
  int first = -1, last = -1, slow = -1;
  double lo = 1e300, hi = 0;
  for (int r = 0; r < int(all.size()); ++r) {
    const StartupFacts& f = all[size_t(r)];
    if (f.started_us >= 0) {
      if (first < 0 || f.started_us < all[size_t(first)].started_us) first = r;
      if (last < 0 || f.started_us > all[size_t(last)].started_us) last = r;
    }
    const double rate = gb_per_s(f.bytes_read, f.load_us);
    if (f.bytes_read > 0 && rate < lo) lo = rate, slow = r;
    hi = std::max(hi, rate);
  }
  std::string s = "start-up: first microbatch ";
  if (first < 0) {
    s += "at an unknown time after launch (no process start times)";
  } else {
    const StartupFacts &a = all[size_t(first)], &b = all[size_t(last)];
    s += fmt("%.2f", 1e-6 * double(first_micro_us - a.started_us));
    s += all.size() == 1 ? std::string(" s after launch (the process start)")
                         : cat(" s after launch (the first rank's process start; the last rank started ",
                               fmt("%.2f", 1e-6 * double(b.started_us - a.started_us)), " s after it: ",
                               world.rank_name(last), ")");
  }
  if (slow >= 0) {
    const StartupFacts& f = all[size_t(slow)];
    s += cat("; weights read at ", fmt("%.2f", lo), all.size() > 1 ? fmt("-%.2f", hi) : std::string(), " GB/s",
             all.size() > 1 ? cat(" per rank (slowest: ", world.rank_name(slow), ", ", read_rate(f.bytes_read, f.load_us),
                                  ")")
                            : std::string());
  }
  return s;
}

}  // namespace lfm2
