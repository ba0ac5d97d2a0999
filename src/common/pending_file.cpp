#include "common/pending_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/file_kind.h"
#include "common/log.h"

namespace lfm2 {
namespace {

// The handler may only read plain memory and call unlink(): a fixed table of paths, each published
// by `ready` after it is written and withdrawn before it is freed.
constexpr int kSlots = 64;
constexpr size_t kPathMax = 4096;
struct Slot {
  std::atomic<bool> claimed{false}, ready{false};
  char path[kPathMax];
};
Slot g_slots[kSlots];

int track(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_slots[i].claimed.compare_exchange_strong(expected, true)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].ready.store(true);
      return i;
    }
  }
  return -1;  // table full: the file is still removed on errors, only not on signals
}

void untrack(int slot) {
  if (slot < 0) return;
  g_slots[slot].ready.store(false);
  g_slots[slot].claimed.store(false);
}

extern "C" void remove_and_reraise(int sig) {
  remove_pending_files_now();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// This host's name up to its first dot, with only [A-Za-z0-9_-] kept: one field of the temporary name.
std::string host_tag() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || !name[0]) return "localhost";
  std::string tag;
  for (const char* p = name; *p && *p != '.'; ++p)
    if (std::isalnum(static_cast<unsigned char>(*p)) || *p == '-' || *p == '_') tag += *p;
  return tag.empty() ? "localhost" : tag;
}

// Seconds since the epoch at which process `pid` started, -1 if there is no such process (or it
// cannot be told).
double process_start_s(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return -1;
  const size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) {
      std::ifstream boot("/proc/stat");
      std::string key;
      long long btime = 0;
      while (boot >> key)
        if (key == "btime" && boot >> btime) break;
      return double(btime) + double(std::stoll(field)) / double(sysconf(_SC_CLK_TCK));
    }
  return -1;
}

// True while the process that named a temporary file may still be writing it: it exists and
// started before the file was last modified.
bool writer_alive(long pid, const std::string& file) {
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return true;
  const double started = process_start_s(pid);
  return started < 0 || started <= double(st.st_mtime) + 1;
}

}  // namespace

std::string pending_tmp_path(const std::string& path) {
  return path + ".tmp." + host_tag() + "." + std::to_string(::getpid());
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = p.filename().string() + ".tmp." + host_tag() + ".";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const long pid = std::stol(digits);
    const std::string file = (dir / name).string();
    if (pid == long(::getpid()) || writer_alive(pid, file)) continue;
    if (::unlink(file.c_str()) == 0) {
      removed.push_back(file);
      log_info(cat("removed ", file, ", left by process ", pid, " of this host, which no longer runs"));
    }
  }
  ::closedir(d);
  return removed;
}

PendingFile::PendingFile(std::string path)
    : path_(output_target("output", path)), tmp_path_(pending_tmp_path(path_)) {
  remove_stale_temporaries(path_);
  slot_ = track(tmp_path_);
}

PendingFile::~PendingFile() {
  untrack(slot_);
  if (!committed_) std::remove(tmp_path_.c_str());
}

void PendingFile::commit() {
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  LFM2_CHECK(!ec, path_, ": cannot rename ", tmp_path_, " into place: ", ec.message());
  committed_ = true;
  untrack(slot_);
  slot_ = -1;
}

void write_whole_file(const std::string& path, const std::string& bytes) {
  PendingFile file(path);
  const int fd = ::open(file.tmp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LFM2_CHECK(fd >= 0, path, ": cannot create ", file.tmp_path(), ": ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      LFM2_FAIL(path, ": writing failed after ", done, " of ", bytes.size(), " bytes: ", std::strerror(err));
    }
    done += size_t(n);
  }
  LFM2_CHECK(::close(fd) == 0, path, ": closing failed: ", std::strerror(errno));  // NFS reports here
  file.commit();
}

void remove_pending_files_on_signals() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) std::signal(sig, remove_and_reraise);
}

void remove_pending_files_now() {
  for (auto& s : g_slots)
    if (s.ready.load()) ::unlink(s.path);
}

}  // namespace lfm2
