// Rotary position embedding, split-half ("rotate_half", NeoX style), as HF Lfm2Moe:
//   inv_freq[i] = 1 / theta^(2i/d)  (i < d/2), computed in fp32 as HF does (libm powf: equal to
//   torch's bits for head_dim <= 64 at theta 1e4..1e6; 1 ulp off in 5 of 1270 entries checked up
//   to head_dim 256);
//   a = pos * inv_freq[i];  out[i] = x[i] cos a - x[i+d/2] sin a;  out[i+d/2] = x[i+d/2] cos a + x[i] sin a.
// Precision: HF forms a = float(pos) * inv_freq in fp32, which loses up to pos * 2^-24 rad at large
// positions. Here a, cos a and sin a are computed in double from the same fp32 inv_freq and rounded
// to fp32 once, so large positions keep full precision; at the golden tests' positions (< 200) the
// two agree to within an ulp of the angle. The products and the sum are fp32 in HF's order.
#pragma once

#include <cstdint>

namespace lfm2::cpu {

// inv_freq (head_dim / 2), HF's fp32 formula.
void rope_inv_freq(float* inv_freq, int64_t head_dim, double theta);

// out, in (n_tokens, n_heads, head_dim), out may equal in; positions (n_tokens); inv_freq (head_dim / 2).
// head_dim even and at most 1024.
void rope(float* out, const float* in, const int64_t* positions, const float* inv_freq, int64_t n_tokens,
          int64_t n_heads, int64_t head_dim, int n_threads = 1);

}  // namespace lfm2::cpu
