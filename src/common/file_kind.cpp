#include "common/file_kind.h"

#include <sys/stat.h>

#include <filesystem>

#include "common/error.h"

namespace lfm2 {
namespace {

std::string kind_of(mode_t m) {
  if (S_ISREG(m)) return "regular file";
  if (S_ISDIR(m)) return "directory";
  if (S_ISCHR(m)) return "character device";
  if (S_ISBLK(m)) return "block device";
  if (S_ISFIFO(m)) return "FIFO";
  if (S_ISSOCK(m)) return "socket";
  if (S_ISLNK(m)) return "symbolic link";
  return "special file";
}

}  // namespace

std::string path_kind(const std::string& path, bool follow_links) {
  struct stat st {};
  const int rc = follow_links ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st);
  return rc == 0 ? kind_of(st.st_mode) : "missing";
}

void check_input_file(const std::string& what, const std::string& path) {
  LFM2_CHECK(!path.empty(), what, ": an empty path");
  const std::string kind = path_kind(path, true);
  if (kind == "regular file") return;
  if (kind == "missing")
    LFM2_CHECK(path_kind(path, false) != "symbolic link", what, " ", path,
               ": is a symbolic link to a missing file");
  LFM2_CHECK(kind != "missing", what, " ", path, ": no such file");
  LFM2_FAIL(what, " ", path, ": is a ", kind, ", not a regular file");
}

std::string output_target(const std::string& what, const std::string& path) {
  namespace fs = std::filesystem;
  LFM2_CHECK(!path.empty(), what, ": an empty path");
  const std::string own = path_kind(path, false);
  if (own == "missing" || own == "regular file") return path;
  LFM2_CHECK(own == "symbolic link", what, " ", path, ": is a ", own,
             ", not a regular file (outputs replace a regular file, or make a new one)");
  const std::string target_kind = path_kind(path, true);
  LFM2_CHECK(target_kind != "missing", what, " ", path, ": is a symbolic link to a missing file");
  LFM2_CHECK(target_kind == "regular file", what, " ", path, ": is a symbolic link to a ", target_kind,
             ", not to a regular file");
  std::error_code ec;
  const fs::path target = fs::canonical(path, ec);
  LFM2_CHECK(!ec, what, " ", path, ": cannot resolve the symbolic link: ", ec.message());
  return target.string();
}

}  // namespace lfm2
