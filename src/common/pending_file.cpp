#include "common/pending_file.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.h"

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
  for (auto& s : g_slots)
    if (s.ready.load()) ::unlink(s.path);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

PendingFile::PendingFile(std::string path)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp." + std::to_string(::getpid())), slot_(track(tmp_path_)) {}

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

void remove_pending_files_on_signals() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, remove_and_reraise);
}

}  // namespace lfm2
