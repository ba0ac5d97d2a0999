// Generation's CUDA kernels against their CPU twins, in fp32, bf16 and fp16, on seeded random
// data: the conv of a step's rows from each slot's state (short_conv_step), the EOS rules and the
// finished flags. Inputs are rounded to the element type first; tolerances per dtype. Skips without
// a GPU. (The paged KV cache's kernels: attention_paged_test.cpp.)
#include <algorithm>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/moe_router.h"
#include "kernels/sample.h"
#include "kernels/short_conv.h"

namespace lfm2 {
namespace {

using namespace test;

template <typename T>
class CudaDecode : public CudaTest {};
TYPED_TEST_SUITE(CudaDecode, ElemTypes, ElemNames);

// The batch API's conv (short_conv_step): a step of decode rows (one kernel) and a mixed step of
// decode rows and prompt chunks at any position, padding rows, ends (two kernels), in any slots,
// against the CPU twin: the rows at the dtype's tolerance, the states exactly (fp32 u of the same
// rounded inputs); a decode row alone gets the bits it gets in the mixed step.
TYPED_TEST(CudaDecode, ShortConvStepAgainstTheCpu) {
  using T = TypeParam;
  // H 36: 16-bit rows of 72 bytes take the one-channel kernel, the others the 16-byte one
  for (auto [H, L] : {std::pair<int64_t, int64_t>{64, 3}, {40, 4}, {36, 2}, {2048, 3}}) {
    const int64_t n_slots = 6;
    // decode rows of slots 5, 0; a chunk of 7 at position 2 (slot 3), a padding row, a prompt of 4
    // from 0 whose state ends at 3 (slot 1), a chunk of 1 at position 9 (slot 2)
    const std::vector<PagedSeq> mixed = {{0, 1, 12, 5}, {1, 1, 1, 0}, {2, 7, 2, 3}, {10, 4, 0, 1}, {14, 1, 9, 2}};
    const std::vector<int32_t> ends = {1, 1, 7, 3, 1};
    const int64_t rows = 15;
    auto bcx = rand_vec(static_cast<size_t>(rows * 3 * H), 60, 2.f), w = rand_vec(static_cast<size_t>(H * L), 61);
    auto state0 = rand_vec(static_cast<size_t>(n_slots * (L - 1) * H), 62, 2.f);
    auto raw = round_to<T>(bcx);
    DevBuf<T> d_bcx(raw.size()), d_out(size_t(rows * H));
    DevBuf<float> d_w(w.size()), d_state(state0.size());
    DevBuf<PagedSeq> d_seqs(mixed.size());
    DevBuf<int32_t> d_ends(ends.size());
    upload(d_bcx, raw);
    upload(d_w, w);
    upload(d_ends, ends);
    auto run = [&](const std::vector<PagedSeq>& seqs, int64_t longest, bool with_ends) {
      upload(d_state, state0);
      upload(d_seqs, seqs);
      cuda::short_conv_step(d_out.get(), d_bcx.get(), d_w.get(), d_state.get(), d_seqs.get(), int64_t(seqs.size()),
                            with_ends ? d_ends.get() : nullptr, rows, longest, H, L, this->stream_);
      this->sync();
      return std::make_pair(download(d_out.get(), size_t(rows * H)), download(d_state.get(), state0.size()));
    };
    for (bool decode_only : {true, false}) {
      const std::vector<PagedSeq> seqs(mixed.begin(), mixed.begin() + (decode_only ? 2 : 5));
      std::vector<float> ref(size_t(rows * H), 0.f), state = state0;
      cpu::short_conv_step(ref.data(), bcx.data(), w.data(), state.data(), seqs.data(), int64_t(seqs.size()),
                           ends.data(), H, L, 1);
      const auto [out, st] = run(seqs, decode_only ? 1 : 7, true);
      for (const PagedSeq& q : seqs)
        EXPECT_TRUE(close_t<T>(std::vector<float>(out.begin() + q.row * H, out.begin() + (q.row + q.n_rows) * H),
                               std::vector<float>(ref.begin() + q.row * H, ref.begin() + (q.row + q.n_rows) * H)))
            << "rows from " << q.row << (decode_only ? ", decode step" : ", mixed step") << ", H " << H;
      EXPECT_EQ(st, state) << (decode_only ? "decode step" : "mixed step") << ", H " << H;
    }
    const auto alone = run({mixed[0]}, 1, false).first, together = run(mixed, 7, true).first;
    EXPECT_EQ(std::vector<float>(alone.begin(), alone.begin() + H),
              std::vector<float>(together.begin(), together.begin() + H)) << "a decode row alone vs in a mixed step";
  }
}

// The EOS rule per slot (apply_eos with slots; the batch API's emits) and restart_ended, against
// cpu::choose_tokens with the slots as its sequence ids.
TEST_F(CudaTest, EndOfSequenceRulePerSlot) {
  const std::vector<int32_t> top = {5, 9, 2, 4}, eos = {7, 2}, slots = {4, 0, 2, 3};
  const int64_t n = int64_t(top.size()), vocab = 12;
  std::vector<int32_t> ended = {-1, 7, -1, 2, -1}, want_ended = ended;
  std::vector<float> logits(size_t(n * vocab), 0.f);
  std::vector<int64_t> seq(slots.begin(), slots.end());
  for (int64_t i = 0; i < n; ++i) logits[size_t(i * vocab + top[size_t(i)])] = 1.f;
  SamplingParams greedy;
  greedy.eos = eos;
  std::vector<int32_t> want(top.size());
  cpu::choose_tokens(want.data(), logits.data(), n, vocab, seq.data(), 1, greedy, want_ended.data());
  EXPECT_EQ(want, (std::vector<int32_t>{5, 9, 2, 2}));
  DevBuf<int32_t> d_top(top.size()), d_eos(eos.size()), d_tokens(top.size()), d_ended(ended.size()),
      d_slots(slots.size());
  upload(d_top, top);
  upload(d_eos, eos);
  upload(d_ended, ended);
  upload(d_slots, slots);
  cuda::apply_eos(d_tokens.get(), d_top.get(), n, 0, d_eos.get(), 2, d_ended.get(), stream_, d_slots.get());
  sync();
  EXPECT_EQ(int_download(d_tokens.get(), size_t(n)), want);
  EXPECT_EQ(int_download(d_ended.get(), ended.size()), want_ended);
  cuda::restart_ended(d_ended.get(), d_slots.get() + 2, 2, stream_);  // slots 2 and 3 start new sequences
  sync();
  want_ended[2] = want_ended[3] = -1;
  EXPECT_EQ(int_download(d_ended.get(), ended.size()), want_ended);
}

// An ended sequence repeats the EOS id it produced (not the first listed one), as cpu::choose_tokens.
TEST_F(CudaTest, EndOfSequenceRule) {
  const std::vector<int32_t> top = {5, 9, 2, 9}, eos = {7, 2};
  const int64_t n = int64_t(top.size()), vocab = 12, first = 1;
  // sequence 2 ended before with 2, the second listed id (rows 1..4 are sequences 1..4)
  std::vector<int32_t> ended = {-1, -1, 2, -1, -1, -1}, want_ended = ended;
  std::vector<float> logits(size_t(n * vocab), 0.f);
  std::vector<int64_t> seq;
  for (int64_t i = 0; i < n; ++i) {
    logits[size_t(i * vocab + top[size_t(i)])] = 1.f;
    seq.push_back(first + i);
  }
  SamplingParams greedy;
  greedy.eos = eos;
  std::vector<int32_t> want(top.size());
  cpu::choose_tokens(want.data(), logits.data(), n, vocab, seq.data(), 3, greedy, want_ended.data());
  EXPECT_EQ(want, (std::vector<int32_t>{5, 2, 2, 9}));
  EXPECT_EQ(want_ended, (std::vector<int32_t>{-1, -1, 2, 2, -1, -1}));  // sequence 3 chose 2: ended with it
  DevBuf<int32_t> d_top(top.size()), d_eos(eos.size()), d_tokens(top.size()), d_ended(ended.size());
  upload(d_top, top);
  upload(d_eos, eos);
  upload(d_ended, ended);
  cuda::apply_eos(d_tokens.get(), d_top.get(), n, first, d_eos.get(), 2, d_ended.get(), stream_);
  sync();
  EXPECT_EQ(int_download(d_tokens.get(), size_t(n)), want);
  EXPECT_EQ(int_download(d_ended.get(), ended.size()), want_ended);
}

// The finished flags of fed-back tokens and the pairs they drop, against the CPU twins.
TEST_F(CudaTest, FinishedFlagsDropTheirPairs) {
  const std::vector<int32_t> tokens = {5, 2, 7, 9, 2, 11, 7}, eos = {7, 2};
  const int64_t n = int64_t(tokens.size()), k = 3;
  std::vector<float> want(tokens.size());
  cpu::finished_flags(want.data(), tokens.data(), n, eos);
  DevBuf<int32_t> d_tokens(tokens.size()), d_eos(eos.size()), d_experts(size_t(n * k));
  DevBuf<float> d_flags(tokens.size());
  upload(d_tokens, tokens);
  upload(d_eos, eos);
  cuda::finished_flags(d_flags.get(), d_tokens.get(), n, d_eos.get(), int(eos.size()), stream_);
  sync();
  const auto flags = download(d_flags.get(), tokens.size());
  EXPECT_EQ(flags, want);
  EXPECT_EQ(flags, (std::vector<float>{0, 1, 1, 0, 1, 0, 1}));

  std::vector<int32_t> experts(size_t(n * k));
  for (size_t i = 0; i < experts.size(); ++i) experts[i] = int32_t(i % 5);
  std::vector<int32_t> ref = experts;
  cpu::moe_drop_rows(ref.data(), want.data(), n, k);
  upload(d_experts, experts);
  cuda::moe_drop_rows(d_experts.get(), d_flags.get(), n, k, stream_);
  sync();
  EXPECT_EQ(int_download(d_experts.get(), experts.size()), ref);
}

}  // namespace
}  // namespace lfm2
