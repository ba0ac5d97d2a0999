// An output file written under a temporary name beside its final path and renamed into place by
// commit(). The final path is common/file_kind.h's output_target(): a symbolic link to a regular file
// is followed (the target is replaced, the link stays); devices, FIFOs, sockets are refused. Until then the temporary file is removed when the PendingFile dies (an error unwinds)
// or, once a program has called remove_pending_files_on_signals(), when SIGINT, SIGTERM, SIGHUP or
// SIGPIPE ends the process: no failure leaves a half-written output, nor a stray temporary file.
//
// The temporary name is "<path>.tmp.<host>.<pid>". A process killed outright (SIGKILL, power loss)
// cannot clean up, so a new PendingFile first removes every "<path>.tmp.<host>.<pid>" of this host
// whose process no longer exists (or started after the file was last written: its pid was reused),
// and says so in the log. Files of other hosts (a shared filesystem) are left alone.
#pragma once

#include <string>
#include <vector>

namespace lfm2 {

class PendingFile {
 public:
  explicit PendingFile(std::string path);  // temporary name: "<path>.tmp.<host>.<pid>"
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }
  // Renames the temporary file into place (close it first); throws lfm2::Error if that fails.
  void commit();

 private:
  std::string path_, tmp_path_;
  int slot_ = -1;  // entry in the signal handler's table, -1 when untracked
  bool committed_ = false;
};

// "<path>.tmp.<host>.<pid>" for this process.
std::string pending_tmp_path(const std::string& path);

// Writes `bytes` to `path` whole or not at all (a PendingFile, then the rename); a failed call throws
// lfm2::Error "<path>: <what failed>: <strerror(errno)>" (a full disk: "No space left on device").
void write_whole_file(const std::string& path, const std::string& bytes);

// Removes the temporary files of `path` left by dead processes of this host; returns their names
// (each is also logged).
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// Installs (once) handlers for SIGINT, SIGTERM, SIGHUP and SIGPIPE that delete every pending
// temporary file and then end the process by the same signal.
void remove_pending_files_on_signals();

// Deletes every pending temporary file now (async-signal-safe; for a watchdog about to _exit).
void remove_pending_files_now();

}  // namespace lfm2
