#include "common/log.h"

#include <chrono>
#include <cstdio>

namespace lfm2 {
namespace {
std::string& prefix_storage() {
  static std::string prefix;
  return prefix;
}
double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}
}  // namespace

void set_log_prefix(const std::string& prefix) { prefix_storage() = prefix; }
const std::string& log_prefix() { return prefix_storage(); }

void log_info(const std::string& line) {
  std::fprintf(stdout, "%s%s\n", prefix_storage().c_str(), line.c_str());
  std::fflush(stdout);
}

void log_error(const std::string& line) { log_error_as(prefix_storage(), line); }

void log_error_as(const std::string& prefix, const std::string& line) {
  std::fflush(stdout);
  std::fprintf(stderr, "%serror: %s\n", prefix.c_str(), line.c_str());
  std::fflush(stderr);
}

Progress::Progress(std::string label, double total, bool enabled)
    : label_(std::move(label)), total_(total > 0 ? total : 1), last_time_(now_s()), enabled_(enabled) {}

void Progress::advance(double amount) {
  done_ += amount;
  double pct = 100.0 * done_ / total_;
  double t = now_s();
  if (enabled_ && (pct - last_pct_ >= 5.0 || t - last_time_ >= 2.0) && done_ < total_) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ": %.0f%%", pct);
    log_info(label_ + buf);
    last_pct_ = pct;
    last_time_ = t;
  }
}

void Progress::finish() {
  if (enabled_) log_info(label_ + ": 100%");
}

}  // namespace lfm2
