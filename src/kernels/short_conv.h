// The LFM2 short-conv mixer between in_proj and out_proj, fused (HF Lfm2MoeShortConv):
//   B, C, x = split3(bcx)                  # chunks of the in_proj output, in that order
//   u = B * x
//   z[t, c] = sum_{j<L} w[c, j] * u[t - (L-1) + j, c]   # causal depthwise conv, zeros before t = 0
//   out = C * z
// over a block of n_seq independent sequences of seq_len tokens (row = s * seq_len + t).
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// out (n_seq * seq_len, hidden); bcx (n_seq * seq_len, 3 * hidden); conv_w (hidden, L), HF
// conv.conv.weight (hidden, 1, L) squeezed.
void short_conv(float* out, const float* bcx, const float* conv_w, int64_t n_seq, int64_t seq_len, int64_t hidden,
                int64_t L, int n_threads = 1);

}  // namespace lfm2::cpu
