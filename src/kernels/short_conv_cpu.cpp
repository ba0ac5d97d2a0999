// Short conv on the CPU: one token row per work item; taps summed in order j = 0..L-1 in fp32,
// skipping taps that fall before the sequence start (they are zeros).
#include "kernels/short_conv.h"

#include <utility>
#include <vector>

#include "common/error.h"
#include "common/parallel.h"

namespace lfm2::cpu {

void short_conv(float* out, const float* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden,
                int64_t L, int n_threads) {
  parallel_for(n_seq * seq_len, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t t = row % seq_len;
      const float* C = bcx + row * 3 * hidden + hidden;
      float* y = out + row * hidden;
      for (int64_t c = 0; c < hidden; ++c) {
        float z = 0;
        for (int64_t j = 0; j < L; ++j) {
          const int64_t tt = t - (L - 1) + j;
          if (tt < 0) continue;
          const float* src = bcx + (row - t + tt) * 3 * hidden;
          z += conv_w[c * L + j] * (src[c] * src[2 * hidden + c]);  // u = B * x
        }
        y[c] = C[c] * z;
      }
    }
  }, 64);
}

namespace {

// u = B * x of position q of sequence sq: from its rows in bcx (q >= first_pos) or from the slot's
// state before the step (q < first_pos); callers skip q < 0.
inline float conv_input(const float* bcx, const float* st, const PagedSeq& sq, int64_t q, int64_t c, int64_t hidden,
                        int64_t L) {
  if (q >= sq.first_pos) {
    const float* src = bcx + (sq.row + (q - sq.first_pos)) * 3 * hidden;
    return src[c] * src[2 * hidden + c];
  }
  return st[(q - (sq.first_pos - (L - 1))) * hidden + c];
}

}  // namespace

void short_conv_step(float* out, const float* bcx, const float* conv_w, float* state, const PagedSeq* seqs,
                     int64_t n_seqs, const int32_t* ends, int64_t hidden, int64_t L, int n_threads) {
  std::vector<std::pair<int64_t, int64_t>> rows;  // (sequence, row within it)
  for (int64_t s = 0; s < n_seqs; ++s) {
    const PagedSeq& sq = seqs[s];
    LFM2_CHECK(sq.n_rows >= 1 && sq.first_pos >= 0 && sq.table_row >= 0, "short_conv_step: sequence ", s, " has ",
               sq.n_rows, " rows at ", sq.first_pos, " in slot ", sq.table_row);
    LFM2_CHECK(!ends || (ends[s] >= 0 && ends[s] <= sq.n_rows), "short_conv_step: sequence ", s, " ends at row ",
               ends ? ends[s] : 0, " of ", sq.n_rows);
    for (int64_t i = 0; i < sq.n_rows; ++i) rows.emplace_back(s, i);
  }
  // The rows' outputs, taps in order j = 0..L-1 as short_conv (the states are only read here).
  parallel_for(int64_t(rows.size()), n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t item = b; item < e; ++item) {
      const auto [s, i] = rows[size_t(item)];
      const PagedSeq& sq = seqs[s];
      const float* st = state + int64_t(sq.table_row) * (L - 1) * hidden;
      const int64_t r = sq.row + i, t = sq.first_pos + i;
      const float* C = bcx + r * 3 * hidden + hidden;
      for (int64_t c = 0; c < hidden; ++c) {
        float z = 0;
        for (int64_t j = 0; j < L; ++j) {
          const int64_t q = t - (L - 1) + j;
          if (q < 0) continue;
          z += conv_w[c * L + j] * conv_input(bcx, st, sq, q, c, hidden, L);
        }
        out[r * hidden + c] = C[c] * z;
      }
    }
  }, 16);
  // Then each slot's new state: u of the L-1 positions before its end (0 before position 0).
  parallel_for(n_seqs, n_threads, [&](int64_t b, int64_t e, int) {
    std::vector<float> next(size_t((L - 1) * hidden));
    for (int64_t s = b; s < e; ++s) {
      const PagedSeq& sq = seqs[s];
      float* st = state + int64_t(sq.table_row) * (L - 1) * hidden;
      const int64_t end = sq.first_pos + (ends ? ends[s] : sq.n_rows);
      for (int64_t j = 0; j < L - 1; ++j) {
        const int64_t q = end - (L - 1) + j;
        for (int64_t c = 0; c < hidden; ++c)
          next[size_t(j * hidden + c)] = q < 0 ? 0.0f : conv_input(bcx, st, sq, q, c, hidden, L);
      }
      std::copy(next.begin(), next.end(), st);
    }
  }, 1);
}

}  // namespace lfm2::cpu
