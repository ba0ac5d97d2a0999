// CLI11 validators with plain messages, shared by lfm2-rank and h5pack (header-only: only the two
// programs' main() include it, and both link CLI11).
//
// CLI11's own checks describe a bad value by a range up to DBL_MAX (309 digits) and call "abc" out
// of range. These say what is wrong with the value as given: "--microbatch: 'abc' is not a number",
// "--timeout: 'nan' is not a finite number of seconds", "--threads: 100000 is more than 1024".
// Validators run on the text before CLI11 converts it, so every message comes from here.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace lfm2::cli {

// A whole number in [lo, hi].
inline CLI::Validator whole(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s, &end, 10);
        if (end == s || text.find_first_of(" \t") == 0) return "'" + text + "' is not a number";
        if (*end != '\0') {
          std::strtod(s, &end);
          return "'" + text + (*end == '\0' ? "' is not a whole number" : "' is not a number");
        }
        if (errno == ERANGE || v > hi) return text + " is more than " + std::to_string(hi);
        if (v < lo) return text + " is less than " + std::to_string(lo);
        return "";
      },
      lo == 0 ? "COUNT >= 0" : "COUNT >= " + std::to_string(lo), "whole");
}

// A finite number of seconds in (0, hi].
inline CLI::Validator seconds(double hi) {
  return CLI::Validator(
      [hi](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        const double v = std::strtod(s, &end);
        if (end == s || *end != '\0') return "'" + text + "' is not a number";
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number of seconds";
        if (v <= 0) return text + " is not a positive number of seconds";
        if (v > hi) return text + " is more than " + std::to_string(int64_t(hi)) + " seconds";
        return "";
      },
      "SECONDS > 0", "seconds");
}

// One of a few words.
inline CLI::Validator one_of(const std::vector<std::string>& words) {
  std::string list;
  for (size_t i = 0; i < words.size(); ++i)
    list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return CLI::Validator(
      [words, list](std::string& text) -> std::string {
        for (const auto& w : words)
          if (text == w) return "";
        return "'" + text + "' is not " + list;
      },
      list, "one_of");
}

}  // namespace lfm2::cli
