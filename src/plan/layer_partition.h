// The layer partition: which contiguous layers each pipeline rank owns.
//
// partition_layers() is the single place the split is computed; everything else (lfm2-rank,
// `h5pack split`, `h5pack inspect --stages`) asks for the stages' StageLayers (io/stage_layers.h).
#pragma once

#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/stage_layers.h"

namespace lfm2 {

// Splits layers into n_ranks contiguous non-empty ranges minimising the most expensive stage
// (first_extra / last_extra: work only the first / last stage does, e.g. the LM head). Returns
// the number of layers per rank. Throws if n_ranks is not in 1..layer_costs.size().
std::vector<int> partition_layers(const std::vector<double>& layer_costs, int n_ranks, double first_extra = 0,
                                  double last_extra = 0);

// Parses a user split such as "6,6,6,6" and checks it covers n_layers with n_ranks non-empty parts.
std::vector<int> parse_layer_counts(const std::string& text, int n_layers, int n_ranks);

// How a layer's cost is estimated: by its FLOPs (the CPU, where every FLOP costs about the same),
// or by the time its parts take on a GPU at measured rates (gpu_costs.h: a grouped expert GEMM
// runs far below a dense one, attention's core grows with the sequence length).
enum class CostModel { kFlops, kGpu };

// Per-layer cost of a model at a sequence length (FLOPs, or GPU seconds, per token), and the LM
// head's extra cost per token on the last stage (last position only unless all_positions).
std::vector<double> layer_costs(const ModelConfig& cfg, int64_t seq_len, CostModel model = CostModel::kFlops);
double head_cost(const ModelConfig& cfg, int64_t seq_len, bool all_positions, CostModel model = CostModel::kFlops);

// Every stage's layers from per-stage layer counts.
std::vector<StageLayers> make_stages(const std::vector<int>& counts);

// The balanced plan of every rank for a model (the default split). Stage files (`h5pack split`)
// are cut with the FLOP model at seq_len 32.
std::vector<StageLayers> default_stages(const ModelConfig& cfg, int n_ranks, int64_t seq_len = 32,
                                           bool all_positions = false, CostModel model = CostModel::kFlops);

}  // namespace lfm2
