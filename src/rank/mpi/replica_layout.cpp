#include "rank/mpi/replica_layout.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace lfm2 {

std::string ReplicaLayout::rank_list(int replica) const {
  const std::vector<int>& r = ranks[size_t(replica)];
  bool consecutive = true;
  for (size_t i = 1; i < r.size(); ++i) consecutive = consecutive && r[i] == r[i - 1] + 1;
  if (r.size() == 1) return cat("rank ", r[0]);
  if (consecutive) return cat("ranks ", r.front(), "-", r.back());
  std::string s = "ranks ";
  for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s;
}

ReplicaLayout group_ranks(const std::vector<int>& node_of_rank, int n_stages) {
  const int n = int(node_of_rank.size());
  LFM2_CHECK(n_stages >= 1 && n % n_stages == 0, n, " ranks do not make pipelines of ", n_stages, " stages");
  // Nodes in the order of their lowest rank, each with its ranks in order.
  std::vector<int> order;
  std::map<int, std::vector<int>> on_node;
  for (int r = 0; r < n; ++r) {
    auto& ranks = on_node[node_of_rank[size_t(r)]];
    if (ranks.empty()) order.push_back(node_of_rank[size_t(r)]);
    ranks.push_back(r);
  }
  ReplicaLayout l;
  l.n_stages = n_stages;
  std::vector<int> left;  // ranks no whole replica on their node took, node after node
  for (int node : order) {
    const std::vector<int>& ranks = on_node[node];
    const size_t whole = ranks.size() / size_t(n_stages) * size_t(n_stages);
    for (size_t i = 0; i < whole; i += size_t(n_stages))
      l.ranks.emplace_back(ranks.begin() + long(i), ranks.begin() + long(i) + n_stages);
    left.insert(left.end(), ranks.begin() + long(whole), ranks.end());
  }
  for (size_t i = 0; i < left.size(); i += size_t(n_stages)) {
    std::vector<int> replica(left.begin() + long(i), left.begin() + long(i) + n_stages);
    std::sort(replica.begin(), replica.end());  // stage order is rank order
    l.ranks.push_back(replica);
  }
  std::sort(l.ranks.begin(), l.ranks.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  l.n_replicas = int(l.ranks.size());
  l.replica_of.assign(size_t(n), -1);
  l.stage_of.assign(size_t(n), -1);
  for (int rep = 0; rep < l.n_replicas; ++rep)
    for (int s = 0; s < n_stages; ++s) {
      l.replica_of[size_t(l.ranks[size_t(rep)][size_t(s)])] = rep;
      l.stage_of[size_t(l.ranks[size_t(rep)][size_t(s)])] = s;
    }
  return l;
}

}  // namespace lfm2
