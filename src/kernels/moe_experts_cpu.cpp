// MoE experts on the CPU: experts in ascending order; within one expert, its tokens split across
// threads in chunks of kChunk (distinct tokens, so no two threads touch one output row).
#include "kernels/moe_experts.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/fp8.h"
#include "common/parallel.h"
#include "kernels/linear.h"
#include "kernels/swiglu.h"

namespace lfm2::cpu {

namespace {

constexpr int64_t kChunk = 16;  // tokens per work item

// The (token, k) entries grouped by expert, tokens ascending within each: expert x's entries are
// [offsets[x], offsets[x + 1]), entry_token / entry_weight the token and its routing weight
// (dropped entries, expert -1: moe_drop_rows, left out); cursor: n_experts ints of scratch.
void group_by_expert(int32_t* offsets, int32_t* cursor, int32_t* entry_token, float* entry_weight,
                     const int32_t* experts, const float* weights, int64_t n_tokens, int64_t n_experts,
                     int64_t top_k) {
  std::fill(offsets, offsets + n_experts + 1, 0);
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    if (experts[i] == -1) continue;
    LFM2_CHECK(experts[i] >= 0 && experts[i] < n_experts, "moe_experts: expert index ", experts[i], " outside [0, ",
               n_experts, ")");
    ++offsets[experts[i] + 1];
  }
  for (int64_t x = 0; x < n_experts; ++x) offsets[x + 1] += offsets[x];
  std::copy(offsets, offsets + n_experts, cursor);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t x = experts[t * top_k + k];
      if (x < 0) continue;
      entry_token[cursor[x]] = int32_t(t);
      entry_weight[cursor[x]] = weights[t * top_k + k];
      ++cursor[x];
    }
}

}  // namespace

MoeScratchSize moe_experts_scratch(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                   int64_t top_k, int n_threads) {
  MoeScratchSize s;
  // per thread: a chunk's gathered inputs and outputs (kChunk, hidden), gate and up (kChunk, inter);
  // shared: the routing weight of each (expert, token) entry
  s.floats = int64_t(resolve_threads(n_threads)) * 2 * kChunk * (hidden + inter) + n_tokens * top_k;
  // offsets (n_experts + 1), cursor (n_experts), token of each entry (n_tokens * top_k)
  s.ints = 2 * n_experts + 1 + n_tokens * top_k;
  return s;
}

void moe_experts(float* out, const float* in, const float* w1, const float* w3, const float* w2,
                 const int32_t* experts, const float* weights, int64_t n_tokens, int64_t hidden, int64_t n_experts,
                 int64_t inter, int64_t top_k, float* scratch, int32_t* int_scratch, int n_threads,
                 int64_t fp8_act_group) {
  const int n_workers = resolve_threads(n_threads);
  int32_t* offsets = int_scratch;               // (n_experts + 1)
  int32_t* cursor = offsets + n_experts + 1;    // (n_experts)
  int32_t* entry_token = cursor + n_experts;    // (n_tokens * top_k), grouped by expert
  float* entry_weight = scratch;                // (n_tokens * top_k)
  float* per_worker = scratch + n_tokens * top_k;
  const int64_t worker_floats = 2 * kChunk * (hidden + inter);
  group_by_expert(offsets, cursor, entry_token, entry_weight, experts, weights, n_tokens, n_experts, top_k);

  std::fill(out, out + n_tokens * hidden, 0.0f);
  for (int64_t x = 0; x < n_experts; ++x) {
    const int64_t begin = offsets[x], count = offsets[x + 1] - begin;
    if (count == 0) continue;
    const float* e_w1 = w1 + x * inter * hidden;
    const float* e_w3 = w3 + x * inter * hidden;
    const float* e_w2 = w2 + x * hidden * inter;
    const int64_t n_chunks = (count + kChunk - 1) / kChunk;
    parallel_for(n_chunks, n_workers, [&](int64_t cb, int64_t ce, int worker) {
      float* xs = per_worker + int64_t(worker) * worker_floats;  // (kChunk, hidden)
      float* ys = xs + kChunk * hidden;                          // (kChunk, hidden)
      float* g = ys + kChunk * hidden;                           // (kChunk, inter)
      float* u = g + kChunk * inter;                             // (kChunk, inter)
      for (int64_t c = cb; c < ce; ++c) {
        const int64_t e0 = begin + c * kChunk, n = std::min(begin + count, e0 + kChunk) - e0;
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(xs + i * hidden, in + int64_t(entry_token[e0 + i]) * hidden, size_t(hidden) * sizeof(float));
        if (fp8_act_group) fp8_fake_quantize_rows(xs, n, hidden, fp8_act_group < 0 ? hidden : fp8_act_group);
        linear(g, xs, e_w1, n, hidden, inter, 1);
        linear(u, xs, e_w3, n, hidden, inter, 1);
        for (int64_t i = 0; i < n * inter; ++i) g[i] = silu(g[i]) * u[i];
        if (fp8_act_group) fp8_fake_quantize_rows(g, n, inter, fp8_act_group < 0 ? inter : fp8_act_group);
        linear(ys, g, e_w2, n, inter, hidden, 1);
        for (int64_t i = 0; i < n; ++i) {  // HF: out.index_add_(y * weight)
          float* o = out + int64_t(entry_token[e0 + i]) * hidden;
          const float w = entry_weight[e0 + i];
          for (int64_t j = 0; j < hidden; ++j) o[j] += ys[i * hidden + j] * w;
        }
      }
    });
  }
}

}  // namespace lfm2::cpu
