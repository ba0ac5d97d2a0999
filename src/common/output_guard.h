// Never destroy an input: checks, before any work, that a program's output is none of its inputs.
//
// Two paths name the same file when both exist and share device and inode (hard links, symbolic
// links, "./a" and "a"), or, when one does not exist yet, when their absolute paths with every
// existing symbolic link resolved are equal. Outputs are written under a temporary name and renamed
// over the final path (common/pending_file.h), so an output that is an input would replace it.
#pragma once

#include <string>
#include <vector>

namespace lfm2 {

// One file a command reads or writes, and how its command line names it ("--inputs", "OUT").
struct NamedPath {
  std::string what;
  std::string path;
};

// True when a and b are the same file by the rule above.
bool same_file(const std::string& a, const std::string& b);

// Throws lfm2::Error "<what> <path>: is also the <input what> (<input path>); refusing to overwrite
// an input" for the first input that `output` names (empty input paths are skipped), and first for
// an output that common/file_kind.h's rules refuse (empty, a device, FIFO, socket, directory, a link
// to anything but a regular file).
void check_output_is_no_input(const NamedPath& output, const std::vector<NamedPath>& inputs);

// "replacing the existing <path>" when `path` exists (a regular file), else "".
std::string replacing_note(const std::string& path);

}  // namespace lfm2
