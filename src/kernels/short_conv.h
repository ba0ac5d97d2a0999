// The LFM2 short-conv mixer between in_proj and out_proj, fused (HF Lfm2MoeShortConv):
//   B, C, x = split3(bcx)                  # chunks of the in_proj output, in that order
//   u = B * x
//   z[t, c] = sum_{j<L} w[c, j] * u[t - (L-1) + j, c]   # causal depthwise conv, zeros before t = 0
//   out = C * z
// over a block of n_seq independent sequences of seq_len tokens (row = s * seq_len + t).
#pragma once

#include <cstdint>

#include "kernels/paged_kv.h"

namespace lfm2::cpu {

// out (n_seq * seq_len, hidden); bcx (n_seq * seq_len, 3 * hidden); conv_w (hidden, L), HF
// conv.conv.weight (hidden, 1, L) squeezed.
void short_conv(float* out, const float* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden,
                int64_t L, int n_threads = 1);

// The rows of a generation step (model/step_batch.h), each sequence continuing from the conv state of
// its slot: sequence i (seqs[i], paged_kv.h's PagedSeq with table_row = its slot) has rows
// row .. row + n_rows - 1 at positions first_pos ..; taps before first_pos come from the slot's
// state (u of positions first_pos - (L-1) .. first_pos - 1, oldest first; not read where they fall
// before position 0), so a prompt in chunks of any size, or a decode row, gets short_conv's bits.
// Afterwards each slot's state holds u of the L-1 positions before first_pos + ends[i] (ends null:
// n_rows; a padded prompt's own length). out (n_rows_all, hidden), bcx
// (n_rows_all, 3 * hidden); state (n_slots, L-1, hidden); rows of no sequence are left alone.
void short_conv_step(float* out, const float* bcx, const float* conv_w, float* state, const PagedSeq* seqs,
                     int64_t n_seqs, const int32_t* ends, int64_t hidden, int64_t L, int n_threads = 1);

}  // namespace lfm2::cpu
