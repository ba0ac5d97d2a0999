#include "common/env.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "common/error.h"

namespace lfm2 {

int64_t env_whole(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  const bool whole = end != v && *end == '\0' && (*v == '-' || (*v >= '0' && *v <= '9'));
  if (!whole || errno == ERANGE || x < lo || x > hi)
    LFM2_FAIL(name, "='", v, "': not a whole number in [", lo, ", ", hi, "]");
  return x;
}

std::string env_choice(const char* name, const char* fallback, std::initializer_list<const char*> allowed) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  std::ostringstream list;
  for (const char* a : allowed) {
    if (std::string(v) == a) return v;
    list << (list.tellp() > 0 ? ", " : "") << a;
  }
  LFM2_FAIL(name, "='", v, "': not one of ", list.str());
}

}  // namespace lfm2
