// The GPU cost model of the layer partition (CostModel::kGpu, layer_partition.h) and of the default
// microbatch (microbatch.h): rates the CUDA backend reaches for each kind of work (gpu_costs.cpp).
#pragma once

#include <cstdint>

#include "io/model_config.h"

namespace lfm2 {

// The GPU model's estimate of one layer / the head, in seconds per token.
double gpu_layer_seconds_per_token(const ModelConfig& cfg, int il, int64_t seq_len);
double gpu_head_seconds_per_token(const ModelConfig& cfg, int64_t seq_len, bool all_positions);
// The GPU's relative throughput at `tokens` tokens per microbatch (1 at 16384 and above).
double gpu_microbatch_efficiency(int64_t tokens);

}  // namespace lfm2
