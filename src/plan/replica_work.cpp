#include "plan/replica_work.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "plan/layer_partition.h"

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

std::vector<int64_t> sequence_costs(int64_t n_seq, int64_t seq_len, const std::vector<int32_t>& lengths,
                                    int64_t new_tokens) {
  std::vector<int64_t> costs(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) costs[size_t(i)] = (lengths.empty() ? seq_len : lengths[size_t(i)]) + new_tokens;
  return costs;
}

std::vector<SeqBlock> split_sequences(const std::vector<int64_t>& costs, int n_blocks) {
  const int64_t n = int64_t(costs.size());
  LFM2_CHECK(n_blocks >= 1, "split_sequences: ", n_blocks, " blocks");
  LFM2_CHECK(n >= n_blocks, n, " sequences for ", n_blocks,
             " replicas: every replica needs at least one (fewer ranks, or more stages per replica: --pipeline)");
  double total = 0;
  for (int64_t c : costs) total += double(c);
  std::vector<SeqBlock> blocks;
  int64_t begin = 0;
  double running = 0;  // cost of sequences [0, begin)
  for (int r = 0; r < n_blocks; ++r) {
    int64_t end = begin;
    if (r == n_blocks - 1) {
      end = n;
    } else {
      // The boundary whose running cost is closest to (r + 1) / n_blocks of the total (ties: the
      // later one); running * n_blocks against (r + 1) * total keeps equal costs exact.
      const double target = double(r + 1) * total;
      while (end < n && running * n_blocks < target) running += double(costs[size_t(end++)]);
      if (end > begin) {
        const double before = running - double(costs[size_t(end - 1)]);
        if (target - before * n_blocks < running * n_blocks - target) {
          running = before;
          --end;
        }
      }
      // Non-empty, and leave one sequence for every block after this one.
      const int64_t lo = begin + 1, hi = n - (n_blocks - 1 - r);
      const int64_t clamped = std::clamp(end, lo, hi);
      for (; end < clamped; ++end) running += double(costs[size_t(end)]);
      for (; end > clamped; --end) running -= double(costs[size_t(end - 1)]);
    }
    blocks.push_back({begin, end});
    begin = end;
  }
  return blocks;
}

std::vector<ReplicaWork> plan_work(const std::vector<SeqBlock>& blocks, int64_t seq_len,
                                   const std::vector<int32_t>& lengths, bool full_width, int64_t microbatch,
                                   int n_stages, bool gpu) {
  std::vector<ReplicaWork> work;
  for (const SeqBlock& b : blocks) {
    ReplicaWork w;
    w.seqs = b;
    w.width = full_width || lengths.empty() ? seq_len : 0;
    for (int64_t i = b.begin; i < b.end && w.width < seq_len; ++i)
      w.width = std::max<int64_t>(w.width, lengths[size_t(i)]);
    w.microbatch =
        microbatch > 0 ? std::min(microbatch, b.size()) : default_microbatch(b.size(), w.width, n_stages, gpu);
    work.push_back(w);
  }
  return work;
}

}  // namespace lfm2
