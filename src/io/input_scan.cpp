#include "io/input_scan.h"

#include <algorithm>

#include "common/xxhash64.h"
#include "io/token_files.h"

namespace lfm2 {

std::string scan_inputs(const std::string& path, int64_t vocab, int64_t max_positions, int64_t block_rows) {
  const TokenInputs head = read_inputs_header(path);
  Xxh64 h;
  for (int64_t b = 0; b < head.n_seq; b += block_rows) {
    const int64_t e = std::min(head.n_seq, b + block_rows);
    int64_t width = 1;
    for (int64_t s = b; s < e; ++s) width = std::max<int64_t>(width, head.length(s));
    const TokenInputs in = read_inputs_block(path, b, e, width);
    check_inputs(in, vocab, max_positions, path, b);
    for (int64_t i = 0; i < in.n_seq; ++i) {
      const int32_t n = in.length(i);
      h.update(&n, sizeof n);
      h.update(in.ids.data() + i * width, size_t(n) * sizeof(int32_t));
    }
  }
  return hex64(h.digest());
}

}  // namespace lfm2
