// An output file written under a temporary name beside its final path and renamed into place by
// commit(). Until then the temporary file is removed when the PendingFile dies (an error unwinds)
// or, once a program has called remove_pending_files_on_signals(), when SIGINT, SIGTERM or SIGHUP
// ends the process: no failure leaves a half-written output, nor a stray temporary file.
#pragma once

#include <string>

namespace lfm2 {

class PendingFile {
 public:
  explicit PendingFile(std::string path);  // temporary name: "<path>.tmp.<pid>"
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

// Installs (once) handlers for SIGINT, SIGTERM and SIGHUP that delete every pending temporary file
// and then end the process by the same signal.
void remove_pending_files_on_signals();

}  // namespace lfm2
