// Validation of lfm2-rank's results against answers: top-1 agreement, max |Δlogit|, pass/fail.
//
// The tolerance on logits is atol + rtol * max|reference logit|, per dtype. A top-1 disagreement is
// forgiven as a near-tie when the reference logit of our token is within that tolerance of the
// reference maximum (two candidates the dtype cannot tell apart). fp32 passes when the logits are
// within tolerance (if the answers have logits; up to 1 % of sequences may be outliers, each
// listed) and every top-1 agrees, near-ties included. bf16 and
// fp16 round every GEMM input, so over a deep model their logits drift past any tight bound: they
// pass on agreement alone (near-ties included) reaching the dtype's minimum fraction, and their
// logit error is reported beside it (a NaN or infinite logit still fails).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "io/token_files.h"
#include "plan/replica_work.h"
#include "rank/mpi/replica_layout.h"

namespace lfm2 {

struct Tolerance {
  double atol = 0, rtol = 0;
  double min_agreement = 1.0;     // fraction of sequences whose top-1 must agree (near-ties count)
  bool logits_must_match = true;  // fp32: max |Δlogit| <= tol is required; bf16/fp16: reported only
  // fp32: the fraction of sequences allowed past the logit tolerance (top-1 still agreeing). An
  // expert choice decided by less than the rounding difference of two correct fp32 implementations
  // moves that one sequence's logits far; such outliers are counted and listed, never hidden.
  double max_outlier_frac = 0.0;
};

// fp32: 1e-3 + 1e-4·scale, all agree, logits within it for >= 99 % of sequences; fp16: 5e-2 +
// 1e-2·scale, bf16: 1e-1 + 3e-2·scale, 50 % agree (half dtypes: the logit error is reported only).
Tolerance tolerance_for(DType act_dtype);

struct ValidationResult {
  int64_t n_seq = 0;
  int64_t agree = 0;      // exact top-1 matches
  int64_t near_ties = 0;  // disagreements within tolerance
  bool compared_logits = false;
  double max_abs_dlogit = 0, mean_abs_dlogit = 0, max_abs_ref = 0, tol = 0;
  int64_t worst_seq = -1;  // sequence with the largest |Δlogit|
  int64_t n_outliers = 0;  // sequences whose max |Δlogit| exceeds tol
  std::vector<std::pair<int64_t, double>> outliers;  // the first few: (sequence, its max |Δlogit|)
  bool passed = false;

  double agree_pct() const { return n_seq ? 100.0 * double(agree) / double(n_seq) : 0.0; }
  // A few lines for the console: agreement, logit error vs tolerance, PASS/FAIL.
  std::vector<std::string> report(DType act_dtype) const;
};

// next_token (N) and logits (N, V, may be empty) of this run against the answers.
ValidationResult validate_outputs(const std::vector<int32_t>& next_token, const std::vector<float>& logits,
                                  int64_t vocab, const TokenAnswers& answers, const Tolerance& tol);

// Generated tokens (N, K) against the answers' `generated` (N, K'): the first min(K, K') of each
// sequence compared position by position.
struct GenerationCheck {
  int64_t n_seq = 0, compared = 0;  // positions compared in all
  int64_t equal = 0;                // of them identical
  int64_t sequences_equal = 0;      // sequences identical over the compared positions
  int64_t first_seq = -1, first_step = -1;  // the first difference (sequence-major), or -1
  bool exact_required = true;       // fp32 greedy: every token must match
  bool passed = false;
  std::vector<std::string> report() const;
};
GenerationCheck check_generated(const std::vector<int32_t>& generated, int64_t n_new, const TokenAnswers& answers,
                                bool exact_required);

// Validation per replica, on its block of the answers: "validation: replica 1 (sequences 6-11 on
// ranks 3-5): top-1 6/6, near-ties 0, max |dlogit| 0.0003 (sequence 8)". None for one replica.
std::vector<std::string> replica_score_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                             const std::vector<int32_t>& next_token, const std::vector<float>& logits,
                                             int64_t vocab, const TokenAnswers& answers, const Tolerance& tol);
// The same for generated tokens: "validation: replica 1 (...): 42/42 tokens equal, 6/6 sequences whole".
std::vector<std::string> replica_generation_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                                  const std::vector<int32_t>& generated, int64_t n_new,
                                                  const TokenAnswers& answers, bool exact);

// The index of the largest value (the first one on ties), as every top-1 in the project is taken.
int32_t argmax(const float* v, int64_t n);

}  // namespace lfm2
