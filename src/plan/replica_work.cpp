#include "plan/replica_work.h"

#include <algorithm>

#include "common/error.h"
#include "plan/microbatch.h"

namespace lfm2 {

std::string SeqBlock::name() const {
  return size() == 1 ? cat("sequence ", begin) : cat("sequences ", begin, "-", end - 1);
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
                                   int n_stages, bool gpu, bool generation) {
  std::vector<ReplicaWork> work;
  for (const SeqBlock& b : blocks) {
    ReplicaWork w;
    w.seqs = b;
    w.width = full_width || lengths.empty() ? seq_len : 0;
    for (int64_t i = b.begin; i < b.end && w.width < seq_len; ++i)
      w.width = std::max<int64_t>(w.width, lengths[size_t(i)]);
    w.microbatch = microbatch > 0 ? std::min(microbatch, b.size())
                   : generation   ? default_generation_microbatch(b.size(), n_stages)
                                  : default_microbatch(b.size(), w.width, n_stages, gpu);
    work.push_back(w);
  }
  return work;
}

}  // namespace lfm2
