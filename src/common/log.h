// Logging: every line from a rank starts "[rank N]"; tools without ranks use their own prefix.
#pragma once

#include <string>

namespace lfm2 {

// Sets the prefix of every later log line, e.g. "[rank 2] " or "h5pack: ".
void set_log_prefix(const std::string& prefix);
const std::string& log_prefix();

// One line to stdout / stderr, prefixed, flushed at once so that ranks' lines interleave by line.
void log_info(const std::string& line);
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
