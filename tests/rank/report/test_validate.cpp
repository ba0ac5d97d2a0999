// Validation maths: agreement, max |Δlogit|, near-ties, per-dtype tolerance, pass/fail.
#include <gtest/gtest.h>

#include <cmath>

#include "rank/report/validate.h"

namespace lfm2 {
namespace {

// Four sequences over a vocabulary of 5; reference logits with clear winners (max |logit| = 10).
TokenAnswers reference() {
  TokenAnswers a;
  a.n_seq = 4;
  a.vocab = 5;
  a.logits = {1, 2, 10, 0,   0,  //
              3, 0, 0,  0,   1,  //
              0, 0, 0,  -10, 4,  //
              1, 1, 1,  1,   2};
  a.next_token = {2, 0, 4, 4};
  return a;
}

TEST(Validate, ExactMatchPasses) {
  const TokenAnswers a = reference();
  const auto r = validate_outputs(a.next_token, a.logits, 5, a, tolerance_for(DType::F32));
  EXPECT_EQ(r.agree, 4);
  EXPECT_DOUBLE_EQ(r.agree_pct(), 100.0);
  EXPECT_EQ(r.max_abs_dlogit, 0.0);
  EXPECT_DOUBLE_EQ(r.max_abs_ref, 10.0);
  EXPECT_DOUBLE_EQ(r.tol, 1e-3 + 1e-4 * 10.0);
  EXPECT_TRUE(r.passed);
}

TEST(Validate, LogitErrorAboveToleranceFails) {
  const TokenAnswers a = reference();
  auto logits = a.logits;
  logits[7] += 0.0025f;  // sequence 1; fp32 tolerance is 0.002
  const auto r = validate_outputs(a.next_token, logits, 5, a, tolerance_for(DType::F32));
  EXPECT_EQ(r.agree, 4);
  EXPECT_NEAR(r.max_abs_dlogit, 0.0025, 1e-6);
  EXPECT_EQ(r.worst_seq, 1);
  EXPECT_FALSE(r.passed);
  // The same error is fine in fp16 (0.05 + 0.01 * 10).
  EXPECT_TRUE(validate_outputs(a.next_token, logits, 5, a, tolerance_for(DType::F16)).passed);
}

TEST(Validate, HalfDtypesReportTheLogitErrorAndPassOnAgreement) {
  const TokenAnswers a = reference();
  auto logits = a.logits;
  logits[7] += 0.5f;  // sequence 1, not its top-1: far over every tolerance, same argmax
  const auto f32 = validate_outputs(a.next_token, logits, 5, a, tolerance_for(DType::F32));
  const auto bf16 = validate_outputs(a.next_token, logits, 5, a, tolerance_for(DType::BF16));
  EXPECT_FALSE(f32.passed);
  EXPECT_TRUE(bf16.passed);
  EXPECT_NEAR(bf16.max_abs_dlogit, 0.5, 1e-6);
  EXPECT_NEAR(bf16.mean_abs_dlogit, 0.5 / 20, 1e-6);  // 4 sequences x 5 logits
  EXPECT_NE(bf16.report(DType::BF16)[1].find("reported; this dtype passes on top-1 agreement"), std::string::npos);
}

TEST(Validate, NearTieIsForgivenClearDisagreementIsNot) {
  TokenAnswers a = reference();
  a.logits[19] = 1.0005f;  // sequence 3: token 4 leads token 0 by 0.0005 < tol
  auto ours = a.next_token;
  ours[3] = 0;
  auto r = validate_outputs(ours, a.logits, 5, a, tolerance_for(DType::F32));
  EXPECT_EQ(r.agree, 3);
  EXPECT_EQ(r.near_ties, 1);
  EXPECT_TRUE(r.passed);
  ours[3] = 4;
  ours[0] = 1;  // 2 vs 10: not a tie
  r = validate_outputs(ours, a.logits, 5, a, tolerance_for(DType::F32));
  EXPECT_EQ(r.agree, 3);
  EXPECT_EQ(r.near_ties, 0);
  EXPECT_FALSE(r.passed);
}

TEST(Validate, TopOneOnlyUsesTheAgreementThreshold) {
  TokenAnswers a;
  a.n_seq = 10;
  a.next_token = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto ours = a.next_token;
  for (int i = 5; i < 10; ++i) ours[i] = 0;  // 5 of 10 agree
  auto r = validate_outputs(ours, {}, 10, a, tolerance_for(DType::BF16));
  EXPECT_FALSE(r.compared_logits);
  EXPECT_EQ(r.agree, 5);
  EXPECT_TRUE(r.passed);                                                              // bf16 needs 50 %
  EXPECT_TRUE(validate_outputs(ours, {}, 10, a, tolerance_for(DType::F16)).passed);   // fp16 needs 50 %
  EXPECT_FALSE(validate_outputs(ours, {}, 10, a, tolerance_for(DType::F32)).passed);
  ours[4] = 0;  // 4 of 10
  EXPECT_FALSE(validate_outputs(ours, {}, 10, a, tolerance_for(DType::BF16)).passed);
}

TEST(Validate, Fp32AllowsOnePercentOfSequencesPastTheToleranceAndListsThem) {
  // 200 sequences over a vocabulary of 3, reference logits (0, 1, 5): top-1 is token 2.
  TokenAnswers a;
  a.n_seq = 200;
  a.vocab = 3;
  for (int s = 0; s < 200; ++s) {
    a.logits.insert(a.logits.end(), {0.0f, 1.0f, 5.0f});
    a.next_token.push_back(2);
  }
  auto logits = a.logits;
  logits[3 * 17 + 1] += 2.0f;  // sequence 17 far off, top-1 unchanged
  logits[3 * 90 + 0] -= 1.0f;  // sequence 90
  auto r = validate_outputs(a.next_token, logits, 3, a, tolerance_for(DType::F32));
  EXPECT_EQ(r.n_outliers, 2);
  ASSERT_EQ(r.outliers.size(), 2u);
  EXPECT_EQ(r.outliers[0].first, 17);
  EXPECT_NEAR(r.outliers[0].second, 2.0, 1e-6);
  EXPECT_EQ(r.outliers[1].first, 90);
  EXPECT_EQ(r.worst_seq, 17);
  EXPECT_TRUE(r.passed);  // 2 of 200 = 1 %
  logits[3 * 150 + 1] += 0.5f;  // a third: 1.5 %
  r = validate_outputs(a.next_token, logits, 3, a, tolerance_for(DType::F32));
  EXPECT_EQ(r.n_outliers, 3);
  EXPECT_FALSE(r.passed);
  bool listed = false;
  for (const auto& line : r.report(DType::F32)) listed |= line.find("3 sequence(s) past the tolerance") != std::string::npos;
  EXPECT_TRUE(listed);
}

TEST(Validate, NaNLogitsFail) {
  const TokenAnswers a = reference();
  auto logits = a.logits;
  logits[3] = NAN;
  const auto r = validate_outputs(a.next_token, logits, 5, a, tolerance_for(DType::BF16));
  EXPECT_TRUE(std::isinf(r.max_abs_dlogit));
  EXPECT_FALSE(r.passed);
}

TEST(Validate, ReportSaysPassOrFail) {
  const TokenAnswers a = reference();
  const auto lines = validate_outputs(a.next_token, a.logits, 5, a, tolerance_for(DType::F32)).report(DType::F32);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("4/4 (100.00%)"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2], "validation: PASS");
}

TEST(Validate, ArgmaxTakesTheFirstOfEqualValues) {
  const float v[] = {1, 3, 3, -1};
  EXPECT_EQ(argmax(v, 4), 1);
  const float w[] = {-5, -7};
  EXPECT_EQ(argmax(w, 2), 0);
}

}  // namespace
}  // namespace lfm2
