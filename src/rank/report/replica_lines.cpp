#include "rank/report/replica_lines.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/error.h"
#include "rank/engine/schedule_chart.h"
#include "rank/report/run_report.h"

namespace lfm2 {
namespace {

std::string significant(double v) {  // printf("%.3g"), as the validation report prints
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string seq_range(const SeqBlock& b) {
  return b.size() == 1 ? cat("sequence ", b.begin) : cat("sequences ", b.begin, "-", b.end - 1);
}

// "replica 1 (sequences 6-11 on ranks 3-5)"
std::string replica_name(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work, int r) {
  return cat("replica ", r, " (", seq_range(work[size_t(r)].seqs), " on ", layout.rank_list(r), ")");
}

template <typename T>
std::vector<T> rows(const std::vector<T>& v, const SeqBlock& b, int64_t row_elems) {
  if (v.empty()) return {};
  return std::vector<T>(v.begin() + b.begin * row_elems, v.begin() + b.end * row_elems);
}

// The answers of one block of sequences.
TokenAnswers answers_of(const TokenAnswers& a, const SeqBlock& b) {
  TokenAnswers out;
  out.n_seq = b.size();
  out.vocab = a.vocab;
  out.next_token = rows(a.next_token, b, 1);
  out.logits = rows(a.logits, b, a.vocab);
  out.n_new = a.n_new;
  out.generated = rows(a.generated, b, a.n_new);
  return out;
}

}  // namespace

std::vector<std::string> replica_plan_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                            const std::vector<std::string>& hosts) {
  if (layout.n_replicas == 1) return {};
  std::set<std::string> nodes(hosts.begin(), hosts.end());
  std::vector<std::string> lines{cat("plan: ", layout.n_replicas, " replicas x ", layout.n_stages, " stages over ",
                                     layout.n_ranks(), " ranks on ", nodes.size(),
                                     nodes.size() == 1 ? " node" : " nodes", " (--pipeline ", layout.n_stages,
                                     "); sequences in contiguous blocks by tokens")};
  for (int r = 0; r < layout.n_replicas; ++r) {
    const ReplicaWork& w = work[size_t(r)];
    std::vector<std::string> seen;
    std::string on;
    for (int rank : layout.ranks[size_t(r)]) {
      const std::string& h = hosts[size_t(rank)];
      if (std::find(seen.begin(), seen.end(), h) != seen.end()) continue;
      seen.push_back(h);
      on += (on.empty() ? "" : " + ") + h;
    }
    lines.push_back(cat("plan: replica ", r, ": ", layout.rank_list(r), " on ", on, ", ", seq_range(w.seqs), " (",
                        w.seqs.size(), " x ", w.width, " tokens in ", w.n_micro(), " microbatches of ", w.microbatch,
                        ", GPipe bubble ", fixed(100 * gpipe_bubble(layout.n_stages, w.n_micro()), 1), "%)"));
  }
  return lines;
}

std::vector<std::string> replica_pipeline_report(const std::vector<StageTiming>& timing, const ReplicaLayout& layout,
                                                 const std::vector<ReplicaWork>& work,
                                                 const std::vector<StagePlan>& plans, int64_t steps) {
  if (layout.n_replicas == 1) return pipeline_report(timing, plans, work[0].n_micro() * steps);
  std::vector<std::string> lines;
  std::vector<double> wall(size_t(layout.n_replicas), 0);
  for (int r = 0; r < layout.n_replicas; ++r) {
    std::vector<StageTiming> mine;
    for (int rank : layout.ranks[size_t(r)]) mine.push_back(timing[size_t(rank)]);
    for (const StageTiming& t : mine) wall[size_t(r)] = std::max(wall[size_t(r)], t.wall_s);
    for (std::string& l : pipeline_report(mine, plans, work[size_t(r)].n_micro() * steps))
      lines.push_back(cat("pipeline: replica ", r, ": ", l.substr(std::string("pipeline: ").size())));
  }
  const auto slowest = std::max_element(wall.begin(), wall.end()), fastest = std::min_element(wall.begin(), wall.end());
  lines.push_back(cat("pipeline: replicas: the slowest (replica ", slowest - wall.begin(), ") ", fixed(*slowest, 4),
                      " s, the fastest (replica ", fastest - wall.begin(), ") ", fixed(*fastest, 4), " s: ",
                      fixed(*slowest > 0 ? 100 * (1 - *fastest / *slowest) : 0, 1), "% imbalance"));
  return lines;
}

std::vector<std::string> replica_score_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                             const std::vector<int32_t>& next_token, const std::vector<float>& logits,
                                             int64_t vocab, const TokenAnswers& answers, const Tolerance& tol) {
  std::vector<std::string> lines;
  if (layout.n_replicas == 1) return lines;
  for (int r = 0; r < layout.n_replicas; ++r) {
    const SeqBlock& b = work[size_t(r)].seqs;
    const ValidationResult v =
        validate_outputs(rows(next_token, b, 1), rows(logits, b, vocab), vocab, answers_of(answers, b), tol);
    std::string logits;
    if (v.compared_logits)
      logits = cat(", max |dlogit| ", significant(v.max_abs_dlogit),
                   v.worst_seq < 0 ? std::string() : cat(" (sequence ", b.begin + v.worst_seq, ")"));
    lines.push_back(cat("validation: ", replica_name(layout, work, r), ": top-1 ", v.agree, "/", v.n_seq,
                        ", near-ties ", v.near_ties, logits));
  }
  return lines;
}

std::vector<std::string> replica_generation_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                                  const std::vector<int32_t>& generated, int64_t n_new,
                                                  const TokenAnswers& answers, bool exact) {
  std::vector<std::string> lines;
  if (layout.n_replicas == 1) return lines;
  for (int r = 0; r < layout.n_replicas; ++r) {
    const SeqBlock& b = work[size_t(r)].seqs;
    const GenerationCheck c = check_generated(rows(generated, b, n_new), n_new, answers_of(answers, b), exact);
    lines.push_back(cat("validation: ", replica_name(layout, work, r), ": ", c.equal, "/", c.compared,
                        " tokens equal, ", c.sequences_equal, "/", c.n_seq, " sequences whole"));
  }
  return lines;
}

}  // namespace lfm2
