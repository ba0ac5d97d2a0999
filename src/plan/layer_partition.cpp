#include "plan/layer_partition.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "plan/gpu_costs.h"

namespace lfm2 {

std::vector<int> partition_layers(const std::vector<double>& layer_costs, int n_ranks, double first_extra,
                                  double last_extra) {
  const int L = int(layer_costs.size());
  LFM2_CHECK(n_ranks >= 1 && n_ranks <= L, "cannot split ", L, " layers over ", n_ranks,
             " ranks (need 1 <= ranks <= layers)");
  std::vector<double> prefix(L + 1, 0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layer_costs[i];
  auto stage_cost = [&](int r, int b, int e) {
    double c = prefix[e] - prefix[b];
    if (r == 0) c += first_extra;
    if (r == n_ranks - 1) c += last_extra;
    return c;
  };
  // best[r][e]: smallest possible maximum stage cost when ranks 0..r cover layers [0, e).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(n_ranks, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(n_ranks, std::vector<int>(L + 1, 0));
  for (int e = 1; e <= L; ++e) best[0][e] = stage_cost(0, 0, e);
  for (int r = 1; r < n_ranks; ++r)
    for (int e = r + 1; e <= L; ++e)
      for (int b = r; b < e; ++b) {
        double c = std::max(best[r - 1][b], stage_cost(r, b, e));
        if (c < best[r][e]) {  // strict: among equal splits keep the earliest cut
          best[r][e] = c;
          cut[r][e] = b;
        }
      }
  std::vector<int> counts(n_ranks);
  int e = L;
  for (int r = n_ranks - 1; r > 0; --r) {
    counts[r] = e - cut[r][e];
    e = cut[r][e];
  }
  counts[0] = e;
  return counts;
}

std::vector<int> parse_layer_counts(const std::string& text, int n_layers, int n_ranks) {
  std::vector<int> counts;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LFM2_CHECK(used == part.size() && used > 0, "--layers '", text, "': '", part, "' is not a number");
    LFM2_CHECK(v > 0, "--layers '", text, "': every rank needs at least one layer");
    counts.push_back(v);
  }
  LFM2_CHECK(int(counts.size()) == n_ranks, "--layers '", text, "' has ", counts.size(), " parts for ", n_ranks,
             " ranks");
  int sum = 0;
  for (int c : counts) sum += c;
  LFM2_CHECK(sum == n_layers, "--layers '", text, "' covers ", sum, " layers, the model has ", n_layers);
  return counts;
}

std::vector<double> layer_costs(const ModelConfig& cfg, int64_t seq_len, CostModel model) {
  std::vector<double> costs;
  for (int il = 0; il < cfg.num_hidden_layers; ++il)
    costs.push_back(model == CostModel::kGpu ? gpu_layer_seconds_per_token(cfg, il, seq_len)
                                             : cfg.layer_flops_per_token(il, seq_len));
  return costs;
}

double head_cost(const ModelConfig& cfg, int64_t seq_len, bool all_positions, CostModel model) {
  if (model == CostModel::kGpu) return gpu_head_seconds_per_token(cfg, seq_len, all_positions);
  double per_position = 2.0 * double(cfg.hidden_size) * double(cfg.vocab_size);
  return all_positions ? per_position : per_position / double(std::max<int64_t>(seq_len, 1));
}

std::vector<StageLayers> make_stages(const std::vector<int>& counts) {
  std::vector<StageLayers> plans;
  int begin = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    plans.push_back({int(r), int(counts.size()), begin, begin + counts[r]});
    begin += counts[r];
  }
  return plans;
}

std::vector<StageLayers> default_stages(const ModelConfig& cfg, int n_ranks, int64_t seq_len, bool all_positions,
                                           CostModel model) {
  return make_stages(partition_layers(layer_costs(cfg, seq_len, model), n_ranks, 0.0,
                                           head_cost(cfg, seq_len, all_positions, model)));
}

}  // namespace lfm2
