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
#include <functional>
#include <limits>
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
        if (end == s || *end != '\0' || text.find_first_of(" \txXpP") != std::string::npos)
          return "'" + text + "' is not a number";
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number of seconds";
        if (v <= 0) return text + " is not a positive number of seconds";
        if (v > hi) return text + " is more than " + std::to_string(int64_t(hi)) + " seconds";
        return "";
      },
      "SECONDS > 0", "seconds");
}

// A whole number in [0, 2^64 - 1] (seeds): negative and larger values are refused, not wrapped.
inline CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t digits = text.find_first_not_of("0123456789");
        if (text.empty() || digits == 0) {
          char* end = nullptr;
          std::strtod(text.c_str(), &end);
          if (!text.empty() && end != text.c_str() && *end == '\0' && text[0] == '-')
            return text + " is less than 0";
          return "'" + text + "' is not a number";
        }
        if (digits != std::string::npos) return "'" + text + "' is not a whole number";
        errno = 0;
        std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE) return text + " is more than " + std::to_string(std::numeric_limits<uint64_t>::max());
        return "";
      },
      "0 <= N < 2^64", "unsigned64");
}

// A finite number for which ok() holds; must_be says which ("in (0, 1]").
inline CLI::Validator real(const std::string& must_be, std::function<bool(double)> ok) {
  return CLI::Validator(
      [must_be, ok](std::string& text) -> std::string {
        const char* s = text.c_str();
        char* end = nullptr;
        const double v = std::strtod(s, &end);
        // Decimal notation only (strtod would also read "0x10" and "infinity").
        if (end == s || *end != '\0' || text.find_first_of(" \txXpP") != std::string::npos)
          return "'" + text + "' is not a number";
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        return ok(v) ? std::string() : text + " is not " + must_be;
      },
      must_be, "real");
}

// A path: the empty string is refused (it would read as "not given").
inline CLI::Validator path() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "an empty path" : ""; }, "PATH",
                        "path");
}

// A comma-separated list of whole numbers in [lo, hi]: "6,6,6,6"; an empty element ("3,3,") is refused.
inline CLI::Validator whole_list(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        size_t start = 0;
        for (;;) {
          const size_t comma = text.find(',', start);
          std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
          if (item.empty()) return "'" + text + "' has an empty element";
          const std::string bad = whole(lo, hi)(item);
          if (!bad.empty()) return "'" + text + "': " + bad;
          if (comma == std::string::npos) return "";
          start = comma + 1;
        }
      },
      "N,N,...", "whole_list");
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
