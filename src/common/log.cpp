#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "common/clock.h"

namespace lfm2 {
namespace {
std::string& prefix_storage() {
  static std::string prefix;
  return prefix;
}
LogLevel g_level = LogLevel::kNormal;
bool g_info_to_stderr = false;
}  // namespace

void set_log_prefix(const std::string& prefix) { prefix_storage() = prefix; }
const std::string& log_prefix() { return prefix_storage(); }

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }
void set_info_to_stderr(bool on) { g_info_to_stderr = on; }

LogLevel log_level_from_env(LogLevel fallback) {
  const char* v = std::getenv("LFM2_LOG_LEVEL");
  if (!v || !*v) return fallback;
  const std::string s(v);
  if (s == "quiet" || s == "error" || s == "warning") return LogLevel::kQuiet;
  if (s == "normal" || s == "info") return LogLevel::kNormal;
  if (s == "verbose" || s == "debug") return LogLevel::kVerbose;
  throw std::runtime_error("LFM2_LOG_LEVEL='" + s + "' is not quiet, normal or verbose");
}

namespace {
void print_info(const std::string& line) {
  FILE* out = g_info_to_stderr ? stderr : stdout;
  std::fprintf(out, "%s%s\n", prefix_storage().c_str(), line.c_str());
  std::fflush(out);
}
}  // namespace

void log_info(const std::string& line) {
  if (g_level == LogLevel::kQuiet && line.rfind("warning: ", 0) != 0) return;
  print_info(line);
}

void log_debug(const std::string& line) {
  if (g_level == LogLevel::kVerbose) print_info(line);
}

void log_event(const std::string& line) {
  std::fprintf(stdout, "%s\n", line.c_str());
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
