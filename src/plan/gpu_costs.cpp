// The GPU cost model of the layer partition (layer_partition.h, CostModel::kGpu): a layer's time is
// estimated from its parts' FLOPs at the rates the CUDA backend reaches for each kind of work, as
// measured with cuda_bench_stage / cuda_bench_kernels (bf16, 4096-token microbatches; figures and
// commands in docs/results.md). A FLOP count alone would say that a dense SwiGLU layer and a top-4
// MoE layer cost the same; on the GPU the MoE's grouped products, routing, permutation and combine
// make it cost more, so the stage holding the two dense layers should take more layers. Only the
// ratios between the rates matter for the split.
#include <algorithm>

#include "plan/gpu_costs.h"

namespace lfm2 {
namespace {

struct GpuRates {
  double gemm_tflops;        // dense projections (cuBLAS)
  double grouped_tflops;     // the experts' grouped products
  double attention_tflops;   // the attention core (QK^T, softmax, PV)
  double moe_us_per_token;   // routing, permutation, SwiGLU and combine of one MoE layer
  double layer_us_per_token; // norms and residual adds of any layer
};

// Fitted to the stages of the full model at P = 2 on two H200s, bf16, 4096 tokens per microbatch
// (docs/results.md, 2026-11-23: 12.2 ms for layers 0-11, 13.2 ms for layers 12-23 and the head):
// conv + dense 0.69 ms, conv + MoE 1.10 ms, attention + MoE 1.05 ms per layer; expert products at
// 642 TFLOP/s and attention's core at 170 TFLOP/s (S = 8192) as cuda_bench_kernels measures them.
// (The single-layer benchmark's conv + MoE at 1.12 ms assumes even routing; a real router's is not.)
constexpr GpuRates kRates = {720.0, 642.0, 170.0, 0.085, 0.0};

// Relative throughput of a layer at a microbatch of this many tokens (16384: 1): the expert GEMMs
// have tokens * top_k / n_experts rows per expert, and a tile of 128 rows is half empty at 1024.
struct Efficiency {
  int64_t tokens;
  double rate;
};
// The grouped products' rate relative to 16384 tokens: 301 / 642 / 681 TFLOP/s at 1024 / 4096 / 16384
// on an H100 (docs/results.md); 2048 and 8192 interpolated.
constexpr Efficiency kEfficiency[] = {{256, 0.15}, {1024, 0.45}, {2048, 0.72}, {4096, 0.93}, {8192, 0.97},
                                      {16384, 1.0}};

}  // namespace

double gpu_microbatch_efficiency(int64_t tokens) {
  const int n = int(sizeof kEfficiency / sizeof kEfficiency[0]);
  if (tokens <= kEfficiency[0].tokens) return kEfficiency[0].rate * double(std::max<int64_t>(tokens, 1)) / 256.0;
  for (int i = 1; i < n; ++i)
    if (tokens <= kEfficiency[i].tokens) {  // linear between the measured points
      const Efficiency a = kEfficiency[i - 1], b = kEfficiency[i];
      return a.rate + (b.rate - a.rate) * double(tokens - a.tokens) / double(b.tokens - a.tokens);
    }
  return 1.0;
}

double gpu_layer_seconds_per_token(const ModelConfig& cfg, int il, int64_t seq_len) {
  const double H = double(cfg.hidden_size), hd = double(cfg.head_dim());
  const double nh = double(cfg.num_attention_heads), nkv = double(cfg.num_key_value_heads);
  double gemm = 0, grouped = 0, attention = 0, us = kRates.layer_us_per_token;
  if (cfg.is_attention(il)) {
    gemm += 2 * H * hd * (2 * nh + 2 * nkv);
    attention += 2.0 * nh * hd * double(std::max<int64_t>(seq_len, 1));  // causal: S/2 keys on average
  } else {
    gemm += 2 * H * 4 * H;
  }
  if (cfg.is_moe(il)) {
    gemm += 2 * H * double(cfg.num_experts);
    grouped += 2 * 3 * H * double(cfg.moe_intermediate_size) * double(cfg.num_experts_per_tok);
    us += kRates.moe_us_per_token;
  } else {
    gemm += 2 * 3 * H * double(cfg.intermediate_size);
  }
  return gemm / (kRates.gemm_tflops * 1e12) + grouped / (kRates.grouped_tflops * 1e12) +
         attention / (kRates.attention_tflops * 1e12) + us * 1e-6;
}

double gpu_head_seconds_per_token(const ModelConfig& cfg, int64_t seq_len, bool all_positions) {
  const double per_position = 2.0 * double(cfg.hidden_size) * double(cfg.vocab_size) / (kRates.gemm_tflops * 1e12);
  return all_positions ? per_position : per_position / double(std::max<int64_t>(seq_len, 1));
}

}  // namespace lfm2
