// A small scheduler over the batch API of generation (model/step_batch.h) for the executors' tests,
// backend-agnostic: sequences admitted into free slots in order, their prompts in chunks, decode
// rows of the running ones, pages taken from a shuffled free list and given back when a sequence
// ends. Each run records every row's hidden state after the step (keyed by sequence and position)
// and the tokens, so that runs with different chunking, batching, slots and pages can be compared
// bit for bit. Also today's calls (alloc_state / prefill / decode / choose) on padded prompts.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/stage_executor.h"

namespace lfm2::test {

struct BatchSeqSpec {
  std::vector<int32_t> prompt;
  int64_t seq = 0;         // keys sampling
  SeqSampling sampling;    // used where Schedule::per_seq_sampling
};

struct Schedule {
  int64_t page_size = 16;
  uint32_t page_seed = 1;     // the free list's shuffle
  int64_t chunk = 1 << 30;    // prompt rows per entry
  int64_t max_prompts = 1 << 30;
  int64_t max_decode = 1 << 30;
  bool mix = true;            // decode and prompt entries in one step (else: decode steps first)
  int64_t n_slots = 8;
  int64_t extra_pages = 5;    // beyond what the sequences need at once
  bool per_seq_sampling = false;
};

struct Outcome {
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> rows;  // (seq, position) -> hidden row
  std::vector<std::vector<int32_t>> tokens;                        // per sequence
  int64_t steps = 0, mixed_steps = 0;
};

// Device memory access for a backend: host <-> executor buffers (memcpy on the CPU).
struct Access {
  std::function<void(void* dst, const void* src, size_t bytes)> to_exec, from_exec;
};

inline Access host_access() {
  return {[](void* d, const void* s, size_t n) { std::memcpy(d, s, n); },
          [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); }};
}

// Generates K tokens for every sequence through the batch API of a single-stage executor.
class BatchRunner {
 public:
  BatchRunner(StageExecutor& st, const std::vector<BatchSeqSpec>& seqs, int64_t K, const Schedule& sc,
              const SamplingParams& defaults, int64_t hidden, const Access& io)
      : st_(st), seqs_(seqs), K_(K), sc_(sc), hidden_(hidden), io_(io), N_(int64_t(seqs.size())) {
    int64_t longest = 0, max_rows = sc.n_slots;
    for (const auto& s : seqs) longest = std::max<int64_t>(longest, int64_t(s.prompt.size()) + K);
    for (const auto& s : seqs) max_rows += int64_t(s.prompt.size());
    const int64_t max_pages = (longest + sc.page_size - 1) / sc.page_size;
    const int64_t total_pages = sc.n_slots * max_pages + sc.extra_pages;
    st.alloc_batch_state(StateShape{sc.n_slots, total_pages, sc.page_size, max_pages}, defaults);
    free_pages_.resize(size_t(total_pages));
    std::iota(free_pages_.begin(), free_pages_.end(), 0);
    std::shuffle(free_pages_.begin(), free_pages_.end(), std::mt19937(sc.page_seed));
    x_ = st.alloc_hidden(max_rows + (sc.n_slots + hidden - 1) / hidden + 1);
    prompt_ids_ = static_cast<int32_t*>(st.alloc_host(max_rows * 4));
    fed_ = st.alloc_tokens(sc.n_slots);
    chosen_ = st.alloc_tokens(sc.n_slots);
    host_tokens_ = static_cast<int32_t*>(st.alloc_host(sc.n_slots * 4));
    out_.tokens.assign(size_t(N_), {});
    done_prompt_.assign(size_t(N_), 0);
    slot_of_.assign(size_t(N_), -1);
    pages_of_.assign(size_t(N_), {});
    slot_busy_.assign(size_t(sc.n_slots), false);
  }

  Outcome run() {
    while (finished_ < N_) {
      admit();
      plan();
      map_pages();
      step();
      ++out_.steps;
    }
    return out_;
  }

 private:
  // Sequences into free slots, in order.
  void admit() {
    for (int64_t s = 0; s < sc_.n_slots && next_ < N_; ++s)
      if (!slot_busy_[size_t(s)]) slot_busy_[size_t(s)] = true, slot_of_[size_t(next_++)] = s;
  }

  // The step's entries: decode rows of running sequences, then prompt chunks of the others.
  void plan() {
    std::vector<int64_t> dec, pro;
    for (int64_t i = 0; i < N_; ++i) {
      if (slot_of_[size_t(i)] < 0 || int64_t(out_.tokens[size_t(i)].size()) >= K_) continue;
      if (done_prompt_[size_t(i)] == int64_t(seqs_[size_t(i)].prompt.size())) {
        if (int64_t(dec.size()) < sc_.max_decode) dec.push_back(i);
      } else if (int64_t(pro.size()) < sc_.max_prompts) {
        pro.push_back(i);
      }
    }
    if (!sc_.mix && !dec.empty() && !pro.empty()) (decode_turn_ ? pro : dec).clear();
    decode_turn_ = !decode_turn_;
    out_.mixed_steps += !dec.empty() && !pro.empty();
    b_ = StepBatch{};
    fed_host_.clear(), ids_.clear(), order_.clear();
    for (int64_t i : dec) {
      const auto& t = out_.tokens[size_t(i)];
      b_.seqs.push_back(BatchSeq{seqs_[size_t(i)].seq, int32_t(slot_of_[size_t(i)]),
                                 int32_t(seqs_[size_t(i)].prompt.size() + t.size() - 1), 1, int32_t(t.size()), true});
      fed_host_.push_back(t.back());
      order_.push_back(i);
    }
    for (int64_t i : pro) {
      const auto& p = seqs_[size_t(i)].prompt;
      const int32_t first = int32_t(done_prompt_[size_t(i)]);
      const int32_t n = int32_t(std::min<int64_t>(sc_.chunk, int64_t(p.size()) - first));
      b_.seqs.push_back(BatchSeq{seqs_[size_t(i)].seq, int32_t(slot_of_[size_t(i)]), first, n,
                                 first + n == int32_t(p.size()) ? 0 : -1, false});
      ids_.insert(ids_.end(), p.begin() + first, p.begin() + first + n);
      order_.push_back(i);
    }
  }

  // Pages for every position the step writes, from the free list.
  void map_pages() {
    for (size_t j = 0; j < b_.seqs.size(); ++j) {
      auto& held = pages_of_[size_t(order_[j])];
      const int64_t need = (b_.seqs[j].first_pos + b_.seqs[j].n_rows + sc_.page_size - 1) / sc_.page_size;
      for (int64_t lp = int64_t(held.size()); lp < need; ++lp) {
        const int32_t page = free_pages_.back();
        free_pages_.pop_back();
        held.push_back(page);
        st_.map_pages(b_.seqs[j].slot, lp, &page, 1);
      }
    }
  }

  // Embed, layers, choice; then the rows and tokens recorded, finished sequences retired.
  void step() {
    std::copy(ids_.begin(), ids_.end(), prompt_ids_);
    if (!fed_host_.empty()) io_.to_exec(fed_, fed_host_.data(), fed_host_.size() * 4);
    st_.embed_batch(b_, prompt_ids_, fed_, x_);
    st_.forward_batch(x_, b_);
    std::vector<SeqSampling> params;
    for (size_t j = 0; j < b_.seqs.size(); ++j)
      if (b_.seqs[j].gen_step >= 0) params.push_back(seqs_[size_t(order_[j])].sampling);
    st_.choose_batch(x_, b_, sc_.per_seq_sampling ? params.data() : nullptr, chosen_, host_tokens_);
    st_.synchronize();
    std::vector<float> xh(static_cast<size_t>(b_.rows() * hidden_));
    io_.from_exec(xh.data(), x_, xh.size() * 4);
    int64_t row = 0, emit = 0;
    for (size_t j = 0; j < b_.seqs.size(); ++j) {
      const BatchSeq& e = b_.seqs[j];
      const int64_t i = order_[j];
      for (int64_t r = 0; r < e.n_rows; ++r, ++row)
        out_.rows[{i, e.first_pos + r}] =
            std::vector<float>(xh.begin() + row * hidden_, xh.begin() + (row + 1) * hidden_);
      if (!e.decode) done_prompt_[size_t(i)] += e.n_rows;
      if (e.gen_step >= 0) out_.tokens[size_t(i)].push_back(host_tokens_[emit++]);
      if (int64_t(out_.tokens[size_t(i)].size()) == K_) retire(i);
    }
  }

  // Its slot and pages go back (the pages to the front of the free list: other places next time).
  void retire(int64_t i) {
    slot_busy_[size_t(slot_of_[size_t(i)])] = false;
    slot_of_[size_t(i)] = -2;
    for (int32_t p : pages_of_[size_t(i)]) free_pages_.insert(free_pages_.begin(), p);
    ++finished_;
  }

  StageExecutor& st_;
  const std::vector<BatchSeqSpec>& seqs_;
  int64_t K_;
  Schedule sc_;
  int64_t hidden_;
  Access io_;
  int64_t N_, next_ = 0, finished_ = 0;
  bool decode_turn_ = true;
  void* x_ = nullptr;
  int32_t *prompt_ids_ = nullptr, *fed_ = nullptr, *chosen_ = nullptr, *host_tokens_ = nullptr;
  std::vector<int32_t> free_pages_;
  std::vector<int64_t> done_prompt_, slot_of_;
  std::vector<std::vector<int32_t>> pages_of_;
  std::vector<bool> slot_busy_;
  StepBatch b_;
  std::vector<int32_t> fed_host_, ids_;
  std::vector<int64_t> order_;  // the sequence of each entry
  Outcome out_;
};

inline Outcome run_batches(StageExecutor& st, const std::vector<BatchSeqSpec>& seqs, int64_t K, const Schedule& sc,
                           const SamplingParams& defaults, int64_t hidden, const Access& io) {
  return BatchRunner(st, seqs, K, sc, defaults, hidden, io).run();
}

// Today's calls on the same sequences: one microbatch of all, prompts padded to the longest,
// `K` tokens; rows recorded at each sequence's own positions.
inline Outcome run_old(StageExecutor& st, const std::vector<BatchSeqSpec>& seqs, int64_t K,
                       const SamplingParams& sampling, int64_t hidden, const Access& io) {
  const int64_t N = int64_t(seqs.size());
  int64_t S = 0;
  for (const auto& s : seqs) S = std::max<int64_t>(S, int64_t(s.prompt.size()));
  std::vector<int32_t> lengths;
  auto* ids = static_cast<int32_t*>(st.alloc_host(N * S * 4));
  for (int64_t i = 0; i < N; ++i) {
    const auto& p = seqs[size_t(i)].prompt;
    lengths.push_back(int32_t(p.size()));
    for (int64_t t = 0; t < S; ++t) ids[i * S + t] = t < int64_t(p.size()) ? p[size_t(t)] : 0;
  }
  st.alloc_state(N, S + K - 1, lengths.data(), sampling);
  void* x = st.alloc_hidden(std::max<int64_t>(N * S, 2 * N));
  int32_t* tokens = st.alloc_tokens(N);
  auto* host = static_cast<int32_t*>(st.alloc_host(N * 4));
  Outcome out;
  out.tokens.assign(size_t(N), {});
  std::vector<float> xh;
  for (int64_t step = 0; step < K; ++step) {
    const int64_t seq_len = step == 0 ? S : 1;
    if (step == 0) {
      st.embed(ids, N, S, x);
      st.prefill(x, 0, N, S);
    } else {
      st.embed_tokens(tokens, N, x);
      st.decode(x, 0, N, step);
    }
    st.choose(x, 0, N, seq_len, step, tokens, host);
    st.synchronize();
    xh.resize(size_t(N * seq_len * hidden));
    io.from_exec(xh.data(), x, xh.size() * 4);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t len = lengths[size_t(i)];
      for (int64_t t = 0; t < (step == 0 ? len : 1); ++t) {
        const int64_t r = i * seq_len + t, pos = step == 0 ? t : len + step - 1;
        out.rows[{i, pos}] = std::vector<float>(xh.begin() + r * hidden, xh.begin() + (r + 1) * hidden);
      }
      out.tokens[size_t(i)].push_back(host[i]);
    }
  }
  return out;
}

// Five ways to step the same sequences (each named): whole prompts; chunks of 7, two prompts a step,
// 3 slots, pages of 64; chunks of 1 on pages of 256; decode and prompt steps apart; one slot.
inline std::vector<std::pair<std::string, Schedule>> schedules() {
  std::vector<std::pair<std::string, Schedule>> c(5);
  c[0].first = "whole prompts";
  c[1].first = "chunks of 7, two prompts a step, 3 slots, pages of 64";
  c[1].second.chunk = 7, c[1].second.max_prompts = 2, c[1].second.n_slots = 3, c[1].second.page_size = 64;
  c[2].first = "chunks of 1, one prompt a step, pages of 256";
  c[2].second.chunk = 1, c[2].second.max_prompts = 1, c[2].second.page_size = 256, c[2].second.page_seed = 9;
  c[3].first = "chunks of 64, decode and prompt steps apart, 2 decode rows a step";
  c[3].second.chunk = 64, c[3].second.mix = false, c[3].second.max_decode = 2, c[3].second.page_seed = 4;
  c[4].first = "one slot";
  c[4].second.n_slots = 1, c[4].second.chunk = 16;
  return c;
}

// The same tokens and bit-identical rows at the same (sequence, position)s.
inline void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.rows.size(), b.rows.size()) << what;
  int64_t differ = 0;
  for (const auto& [key, row] : a.rows) {
    auto it = b.rows.find(key);
    ASSERT_NE(it, b.rows.end()) << what << ": no row of sequence " << key.first << " at " << key.second;
    if (row != it->second && differ++ < 3)
      ADD_FAILURE() << what << ": sequence " << key.first << " position " << key.second << " differs";
  }
  EXPECT_EQ(differ, 0) << what;
}

}  // namespace lfm2::test
