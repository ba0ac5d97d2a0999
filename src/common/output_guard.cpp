#include "common/output_guard.h"

#include <sys/stat.h>

#include <filesystem>

#include "common/error.h"
#include "common/file_kind.h"

namespace lfm2 {

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {}, sb {};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  namespace fs = std::filesystem;
  std::error_code e1, e2;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a), e1), cb = fs::weakly_canonical(fs::absolute(b), e2);
  if (e1 || e2) return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal();
  return ca == cb;
}

void check_output_is_no_input(const NamedPath& output, const std::vector<NamedPath>& inputs) {
  output_target(output.what, output.path);  // a regular file, a new name or a link to a regular file
  for (const NamedPath& in : inputs)
    LFM2_CHECK(!same_file(output.path, in.path), output.what, " ", output.path, ": is also the ", in.what,
               in.path == output.path ? std::string() : " (" + in.path + ")", "; refusing to overwrite an input");
}

std::string replacing_note(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ? "replacing the existing " + path : std::string();
}

}  // namespace lfm2
