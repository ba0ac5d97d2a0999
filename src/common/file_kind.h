// What a path names, and the rules for the files the tools read and write (docs/pipeline.md,
// "Files that are not regular files").
//
// Inputs: a regular file, or a symbolic link to one (read through). A directory, FIFO, socket or
// device is refused before it is opened: opening a FIFO would block until a writer came, before any
// --timeout applies.
// Outputs: written under a temporary name beside the file and renamed over it (pending_file.h), so
// only a regular file (or a new path) may be replaced. A symbolic link to a regular file is followed:
// its target is replaced and the link stays. A link to anything else, a dangling link, a directory,
// FIFO, socket or device is refused (as root, `--output /dev/null` would otherwise replace /dev/null).
#pragma once

#include <string>

namespace lfm2 {

// "regular file", "directory", "character device", "block device", "FIFO", "socket",
// "symbolic link" (lstat: the path itself) or "missing".
std::string path_kind(const std::string& path, bool follow_links);

// Throws lfm2::Error "<what> <path>: ..." unless `path` names a readable regular file (through links):
// empty, missing, or the kind it is instead.
void check_input_file(const std::string& what, const std::string& path);

// The file an output at `path` replaces: `path` itself (a regular file or a new name), or, for a
// symbolic link to a regular file, the link's final target. Throws lfm2::Error "<what> <path>: ..."
// for an empty path and every kind refused above.
std::string output_target(const std::string& what, const std::string& path);

}  // namespace lfm2
