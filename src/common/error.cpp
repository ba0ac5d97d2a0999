#include "common/error.h"

namespace lfm2 {

namespace {
std::string located(const char* file, int line, const std::string& what, const std::string& msg) {
  std::string base = file;
  auto slash = base.find("src/");
  if (slash != std::string::npos) base = base.substr(slash);
  return cat(msg, " (", what, " at ", base, ":", line, ")");
}
}  // namespace

void throw_error(const char* file, int line, const std::string& what, const std::string& msg) {
  throw Error(located(file, line, what, msg));
}

void throw_timeout(const char* file, int line, const std::string& msg, TimeoutKind kind) {
  throw TimeoutError(located(file, line, "timeout", msg), kind);
}

}  // namespace lfm2
