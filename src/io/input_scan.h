// An inputs file read once, block by block (never all at once): every prompt's ids checked against
// the vocabulary (the first offender named by its row), and the file's fingerprint: XXH64 over each
// sequence's length and its ids (padding excluded), in input order. A continuous generation job
// scans its inputs so before it starts (a bad id is a one-line error before any work, not midway),
// and a resumed job must find the same fingerprint in its journal.
#pragma once

#include <cstdint>
#include <string>

namespace lfm2 {

// Rows of `block_rows` sequences at a time; returns the fingerprint as 16 hex digits.
std::string scan_inputs(const std::string& path, int64_t vocab, int64_t max_positions, int64_t block_rows = 1024);

}  // namespace lfm2
