// cpu::short_conv_step, the conv of a generation step's rows continuing from each slot's state:
// a prompt in chunks of any size gives short_conv's bits and leaves short_conv_state's state; decode
// rows give short_conv_decode's bits and states; several sequences in any slots and row order.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "kernels/short_conv.h"
#include "test_util.h"

namespace lfm2 {
namespace {

using test::randn;

// A prompt of S rows through short_conv_step in chunks of `chunk` (slot 2 of 4), then `n_dec`
// decode rows; against short_conv over the whole S + n_dec rows.
TEST(ShortConvStep, ChunksAndDecodeRowsGetShortConvsBits) {
  for (auto [H, L] : {std::pair<int64_t, int64_t>{16, 3}, {7, 4}, {8, 2}, {5, 1}}) {
    const int64_t S = 70, n_dec = 3, T = S + n_dec, slot = 2, n_slots = 4;
    const auto bcx = randn(T * 3 * H, 30), w = randn(H * L, 31);
    std::vector<float> whole(size_t(T * H));
    cpu::short_conv(whole.data(), bcx.data(), w.data(), 1, T, H, L, 2);
    std::vector<float> want_state(size_t((L - 1) * H));
    cpu::short_conv_state(want_state.data(), bcx.data(), S, H, L);
    for (int64_t chunk : {int64_t(1), int64_t(2), int64_t(7), int64_t(64), S}) {
      std::vector<float> state(size_t(n_slots * (L - 1) * H), 99.0f);  // never read at position 0
      std::vector<float> out(size_t(T * H), -1.0f);
      for (int64_t p = 0; p < T;) {
        const int64_t n = p < S ? std::min(chunk, S - p) : 1;  // prompt chunks, then decode rows
        std::vector<float> o(size_t(n * H));
        const PagedSeq sq{0, int32_t(n), int32_t(p), int32_t(slot)};
        cpu::short_conv_step(o.data(), bcx.data() + p * 3 * H, w.data(), state.data(), &sq, 1, nullptr, H, L, 2);
        std::copy(o.begin(), o.end(), out.begin() + p * H);
        p += n;
        if (p == S) {
          EXPECT_EQ(std::vector<float>(state.begin() + slot * (L - 1) * H, state.begin() + (slot + 1) * (L - 1) * H),
                    want_state) << "state after the prompt, chunks of " << chunk;
        }
      }
      EXPECT_EQ(out, whole) << "H " << H << " L " << L << ", chunks of " << chunk;
    }
  }
}

// Decode rows of three slots in one call against short_conv_decode on each slot alone.
TEST(ShortConvStep, DecodeRowsEqualShortConvDecode) {
  const int64_t H = 12, L = 3, n_slots = 5;
  const auto bcx = randn(3 * 3 * H, 40), w = randn(H * L, 41), state0 = randn(n_slots * (L - 1) * H, 42);
  const std::vector<int32_t> slots{4, 0, 2};
  const std::vector<int64_t> pos{9, 1, 0};  // position 1: one tap from the state; 0: none
  std::vector<PagedSeq> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(PagedSeq{i, 1, int32_t(pos[size_t(i)]), slots[size_t(i)]});
  std::vector<float> state = state0, out(size_t(3 * H));
  cpu::short_conv_step(out.data(), bcx.data(), w.data(), state.data(), seqs.data(), 3, nullptr, H, L, 3);
  for (int i = 0; i < 3; ++i) {
    const int64_t s = slots[size_t(i)];
    std::vector<float> st(state0.begin() + s * (L - 1) * H, state0.begin() + (s + 1) * (L - 1) * H);
    std::vector<float> o(static_cast<size_t>(H));
    cpu::short_conv_decode(o.data(), bcx.data() + i * 3 * H, w.data(), st.data(), &pos[size_t(i)], 1, H, L, 1);
    EXPECT_EQ(std::vector<float>(out.begin() + i * H, out.begin() + (i + 1) * H), o) << "row " << i;
    for (int64_t j = 0; j < L - 1; ++j)  // positions before 0 hold 0 (short_conv_decode shifts them in)
      if (pos[size_t(i)] - (L - 2) + j < 0) std::fill(st.begin() + j * H, st.begin() + (j + 1) * H, 0.0f);
    EXPECT_EQ(std::vector<float>(state.begin() + s * (L - 1) * H, state.begin() + (s + 1) * (L - 1) * H), st)
        << "slot " << s;
  }
  // untouched slots keep their state
  for (int64_t s : {1, 3})
    EXPECT_EQ(std::vector<float>(state.begin() + s * (L - 1) * H, state.begin() + (s + 1) * (L - 1) * H),
              std::vector<float>(state0.begin() + s * (L - 1) * H, state0.begin() + (s + 1) * (L - 1) * H));
}

// Padded prompts (today's prefill): every row computed, the state taken at each prompt's own end.
TEST(ShortConvStep, EndsTakeTheStateAtEachPromptsLength) {
  const int64_t H = 9, L = 4, S = 6, n = 3;
  const auto bcx = randn(n * S * 3 * H, 50), w = randn(H * L, 51);
  const std::vector<int32_t> lengths{6, 2, 4};
  std::vector<PagedSeq> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back(PagedSeq{int32_t(i * S), int32_t(S), 0, i});
  std::vector<float> state(size_t(n * (L - 1) * H), 7.0f), out(size_t(n * S * H)), whole(out.size());
  cpu::short_conv_step(out.data(), bcx.data(), w.data(), state.data(), seqs.data(), n, lengths.data(), H, L, 2);
  cpu::short_conv(whole.data(), bcx.data(), w.data(), n, S, H, L, 1);
  EXPECT_EQ(out, whole);
  for (int i = 0; i < n; ++i) {
    std::vector<float> want(size_t((L - 1) * H));
    cpu::short_conv_state(want.data(), bcx.data() + i * S * 3 * H, lengths[size_t(i)], H, L);
    EXPECT_EQ(std::vector<float>(state.begin() + i * (L - 1) * H, state.begin() + (i + 1) * (L - 1) * H), want)
        << "sequence " << i;
  }
  const int32_t bad = S + 1;
  EXPECT_THROW(cpu::short_conv_step(out.data(), bcx.data(), w.data(), state.data(), seqs.data(), 1, &bad, H, L, 1),
               Error);
}

}  // namespace
}  // namespace lfm2
