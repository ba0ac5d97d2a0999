#include "common/error.h"

namespace lfm2 {

void throw_error(const char* file, int line, const std::string& what, const std::string& msg) {
  std::string base = file;
  auto slash = base.find("src/");
  if (slash != std::string::npos) base = base.substr(slash);
  throw Error(cat(msg, " (", what, " at ", base, ":", line, ")"));
}

}  // namespace lfm2
