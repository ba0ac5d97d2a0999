// Microbatches: how many a batch makes, and the default size.
#pragma once

#include <cstdint>

namespace lfm2 {

// The microbatches of n_seq sequences in microbatches of `microbatch` (the last may be smaller).
inline int64_t n_microbatches(int64_t n_seq, int64_t microbatch) { return (n_seq + microbatch - 1) / microbatch; }

// The default sequences per microbatch. CPU: about 4 microbatches per rank. GPU: the size that
// minimises the estimated run time (M + P - 1) x (tokens per microbatch / relative GEMM efficiency
// at that many tokens): small microbatches shrink the fill-and-drain bubble, large ones keep the
// expert GEMMs efficient (gpu_costs.cpp holds the efficiency curve). At most 16384 tokens each.
int64_t default_microbatch(int64_t n_seq, int64_t seq_len, int n_ranks, bool gpu);

// Generation's default (the static schedule; issue 26): P groups holding every sequence, so that
// each decode step reads the weights once per group while every stage has a group to work on (the
// state of every sequence is held at once whatever the groups; prefill chunks, not the groups,
// bound a prefill's buffers).
inline int64_t default_generation_microbatch(int64_t n_seq, int n_ranks) {
  return n_microbatches(n_seq, n_ranks > 0 ? n_ranks : 1);
}

}  // namespace lfm2
