// Logging: every line from a rank starts "[rank N]"; tools without ranks use their own prefix.
#pragma once

#include <string>

namespace lfm2 {

// Sets the prefix of every later log line, e.g. "[rank 2] " or "h5pack: ".
void set_log_prefix(const std::string& prefix);
const std::string& log_prefix();

// How much a program says: errors only (and warnings), its usual lines, or those and details.
// Set from --quiet / --verbose, else LFM2_LOG_LEVEL (quiet | normal | verbose, or error | info | debug).
enum class LogLevel { kQuiet = 0, kNormal = 1, kVerbose = 2 };
void set_log_level(LogLevel level);
LogLevel log_level();
// LFM2_LOG_LEVEL's level, or `fallback` when it is unset; an unknown value throws naming it.
LogLevel log_level_from_env(LogLevel fallback);
// Info lines to stderr instead of stdout (--stream keeps stdout for its JSON events alone).
void set_info_to_stderr(bool on);

// One line to stdout / stderr, prefixed, flushed at once so that ranks' lines interleave by line.
// log_info is silent under kQuiet except for lines that start "warning: "; log_debug speaks only
// under kVerbose.
void log_info(const std::string& line);
void log_debug(const std::string& line);
// A line of machine-read output (--stream's events) to stdout as it is, at every level.
void log_event(const std::string& line);
void log_error(const std::string& line);
// The same with another prefix: a line that rank 0 prints for the rank that found the error.
void log_error_as(const std::string& prefix, const std::string& line);

// Progress for long steps: "label: done/total (pct%)", printed at most every ~5% or 2 s.
class Progress {
 public:
  Progress(std::string label, double total, bool enabled = true);
  void advance(double amount);
  void finish();

 private:
  std::string label_;
  double total_, done_ = 0, last_pct_ = -100;
  double last_time_;
  bool enabled_;
};

}  // namespace lfm2
