// SwiGLU gating: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (torch's fp32 formula).
#pragma once

#include <cmath>
#include <cstdint>

namespace lfm2::cpu {

// out, gate, up (n); out may equal gate or up.
void swiglu(float* out, const float* gate, const float* up, int64_t n, int n_threads = 1);

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace lfm2::cpu
