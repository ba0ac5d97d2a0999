// cpu::short_conv_step, the conv of a generation step's rows continuing from each slot's state:
// a prompt in chunks of any size gives short_conv's bits and leaves the inputs of its last positions
// as the state; decode rows from any state give short_conv's bits of a prompt that ends with those
// inputs; several sequences in any slots and row order.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "kernels/short_conv.h"
#include "test_util.h"

namespace lfm2 {
namespace {

using test::randn;

// The conv state a sequence's rows leave after `length` of them: u = B * x of its last L-1
// positions, (L-1, hidden) oldest first, 0 before position 0.
std::vector<float> conv_state(const float* bcx, int64_t length, int64_t H, int64_t L) {
  std::vector<float> st(size_t((L - 1) * H), 0.0f);
  for (int64_t j = 0; j < L - 1; ++j) {
    const int64_t t = length - (L - 1) + j;
    if (t < 0) continue;
    for (int64_t c = 0; c < H; ++c) st[size_t(j * H + c)] = bcx[t * 3 * H + c] * bcx[t * 3 * H + 2 * H + c];
  }
  return st;
}

// A prompt of S rows through short_conv_step in chunks of `chunk` (slot 2 of 4), then `n_dec`
// decode rows; against short_conv over the whole S + n_dec rows.
TEST(ShortConvStep, ChunksAndDecodeRowsGetShortConvsBits) {
  for (auto [H, L] : {std::pair<int64_t, int64_t>{16, 3}, {7, 4}, {8, 2}, {5, 1}}) {
    const int64_t S = 70, n_dec = 3, T = S + n_dec, slot = 2, n_slots = 4;
    const auto bcx = randn(T * 3 * H, 30), w = randn(H * L, 31);
    std::vector<float> whole(size_t(T * H));
    cpu::short_conv(whole.data(), bcx.data(), w.data(), 1, T, H, L, 2);
    const std::vector<float> want_state = conv_state(bcx.data(), S, H, L);
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

// Decode rows of three slots in one call: each row and its slot's new state as short_conv gives the
// last row of a prompt whose earlier positions hold the slot's state as their inputs (B = 1, x = u).
TEST(ShortConvStep, DecodeRowsContinueTheirSlotsStates) {
  const int64_t H = 12, L = 3, n_slots = 5;
  const auto bcx = randn(3 * 3 * H, 40), w = randn(H * L, 41), state0 = randn(n_slots * (L - 1) * H, 42);
  const std::vector<int32_t> slots{4, 0, 2};
  const std::vector<int64_t> pos{9, 1, 0};  // position 1: one tap from the state; 0: none
  std::vector<PagedSeq> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(PagedSeq{i, 1, int32_t(pos[size_t(i)]), slots[size_t(i)]});
  std::vector<float> state = state0, out(size_t(3 * H));
  cpu::short_conv_step(out.data(), bcx.data(), w.data(), state.data(), seqs.data(), 3, nullptr, H, L, 3);
  for (int i = 0; i < 3; ++i) {
    const int64_t s = slots[size_t(i)], p = pos[size_t(i)];
    std::vector<float> prompt(size_t((p + 1) * 3 * H), 0.0f), whole(size_t((p + 1) * H));
    for (int64_t j = 0; j < L - 1; ++j) {
      const int64_t q = p - (L - 1) + j;  // the state's j-th input is position q's
      if (q < 0) continue;
      for (int64_t c = 0; c < H; ++c) {
        prompt[size_t(q * 3 * H + c)] = 1.0f;
        prompt[size_t(q * 3 * H + 2 * H + c)] = state0[size_t((s * (L - 1) + j) * H + c)];
      }
    }
    std::copy(bcx.begin() + i * 3 * H, bcx.begin() + (i + 1) * 3 * H, prompt.begin() + p * 3 * H);
    cpu::short_conv(whole.data(), prompt.data(), w.data(), 1, p + 1, H, L, 1);
    EXPECT_EQ(std::vector<float>(out.begin() + i * H, out.begin() + (i + 1) * H),
              std::vector<float>(whole.end() - H, whole.end())) << "row " << i;
    EXPECT_EQ(std::vector<float>(state.begin() + s * (L - 1) * H, state.begin() + (s + 1) * (L - 1) * H),
              conv_state(prompt.data(), p + 1, H, L)) << "slot " << s;
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
    EXPECT_EQ(std::vector<float>(state.begin() + i * (L - 1) * H, state.begin() + (i + 1) * (L - 1) * H),
              conv_state(bcx.data() + i * S * 3 * H, lengths[size_t(i)], H, L))
        << "sequence " << i;
  }
  const int32_t bad = S + 1;
  EXPECT_THROW(cpu::short_conv_step(out.data(), bcx.data(), w.data(), state.data(), seqs.data(), 1, &bad, H, L, 1),
               Error);
}

}  // namespace
}  // namespace lfm2
