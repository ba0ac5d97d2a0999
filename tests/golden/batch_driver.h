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
#include <vector>

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
inline Outcome run_batches(StageExecutor& st, const std::vector<BatchSeqSpec>& seqs, int64_t K, const Schedule& sc,
                           const SamplingParams& defaults, int64_t hidden, const Access& io) {
  const int64_t N = int64_t(seqs.size());
  int64_t longest = 0, total_pages = 0;
  for (const auto& s : seqs) longest = std::max<int64_t>(longest, int64_t(s.prompt.size()) + K);
  const int64_t max_pages = (longest + sc.page_size - 1) / sc.page_size;
  total_pages = sc.n_slots * max_pages + sc.extra_pages;
  StateShape shape{sc.n_slots, total_pages, sc.page_size, max_pages};
  st.alloc_batch_state(shape, defaults);
  std::vector<int32_t> free_pages(static_cast<size_t>(total_pages));
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), std::mt19937(sc.page_seed));

  int64_t max_rows = 0;
  for (const auto& s : seqs) max_rows += int64_t(s.prompt.size());
  max_rows += sc.n_slots;
  void* x = st.alloc_hidden(max_rows + (sc.n_slots + hidden - 1) / hidden + 1);
  auto* prompt_ids = static_cast<int32_t*>(st.alloc_host(max_rows * 4));
  int32_t* fed = st.alloc_tokens(sc.n_slots);
  int32_t* chosen = st.alloc_tokens(sc.n_slots);
  auto* host_tokens = static_cast<int32_t*>(st.alloc_host(sc.n_slots * 4));
  std::vector<float> xh;

  Outcome out;
  out.tokens.assign(size_t(N), {});
  std::vector<int64_t> done_prompt(size_t(N), 0), slot_of(size_t(N), -1), pages_held(size_t(N), 0);
  std::vector<std::vector<int32_t>> pages_of(static_cast<size_t>(N));
  std::vector<bool> slot_busy(size_t(sc.n_slots), false);
  int64_t next_admit = 0, finished = 0;
  bool decode_turn = true;
  while (finished < N) {
    // admit sequences into free slots, in order
    for (int64_t s = 0; s < sc.n_slots && next_admit < N; ++s)
      if (!slot_busy[size_t(s)]) {
        slot_busy[size_t(s)] = true;
        slot_of[size_t(next_admit++)] = s;
      }
    std::vector<int64_t> dec, pro;
    for (int64_t i = 0; i < N; ++i) {
      if (slot_of[size_t(i)] < 0 || int64_t(out.tokens[size_t(i)].size()) >= K) continue;
      if (done_prompt[size_t(i)] == int64_t(seqs[size_t(i)].prompt.size())) {
        if (int64_t(dec.size()) < sc.max_decode) dec.push_back(i);
      } else if (int64_t(pro.size()) < sc.max_prompts) {
        pro.push_back(i);
      }
    }
    if (!sc.mix && !dec.empty() && !pro.empty()) (decode_turn ? pro : dec).clear();
    decode_turn = !decode_turn;
    StepBatch b;
    std::vector<int32_t> fed_host, ids;
    std::vector<int64_t> order;  // the sequence of each entry
    for (int64_t i : dec) {
      BatchSeq e;
      e.seq = seqs[size_t(i)].seq;
      e.slot = int32_t(slot_of[size_t(i)]);
      e.first_pos = int32_t(seqs[size_t(i)].prompt.size() + out.tokens[size_t(i)].size() - 1);
      e.n_rows = 1;
      e.gen_step = int32_t(out.tokens[size_t(i)].size());
      e.decode = true;
      b.seqs.push_back(e);
      fed_host.push_back(out.tokens[size_t(i)].back());
      order.push_back(i);
    }
    for (int64_t i : pro) {
      const auto& p = seqs[size_t(i)].prompt;
      BatchSeq e;
      e.seq = seqs[size_t(i)].seq;
      e.slot = int32_t(slot_of[size_t(i)]);
      e.first_pos = int32_t(done_prompt[size_t(i)]);
      e.n_rows = int32_t(std::min<int64_t>(sc.chunk, int64_t(p.size()) - e.first_pos));
      e.gen_step = e.first_pos + e.n_rows == int32_t(p.size()) ? 0 : -1;
      b.seqs.push_back(e);
      ids.insert(ids.end(), p.begin() + e.first_pos, p.begin() + e.first_pos + e.n_rows);
      order.push_back(i);
    }
    // pages for every position the step writes
    for (size_t j = 0; j < b.seqs.size(); ++j) {
      const int64_t i = order[j], need = (b.seqs[j].first_pos + b.seqs[j].n_rows + sc.page_size - 1) / sc.page_size;
      for (int64_t lp = pages_held[size_t(i)]; lp < need; ++lp) {
        const int32_t page = free_pages.back();
        free_pages.pop_back();
        pages_of[size_t(i)].push_back(page);
        st.map_pages(b.seqs[j].slot, lp, &page, 1);
      }
      pages_held[size_t(i)] = std::max(pages_held[size_t(i)], need);
    }
    std::copy(ids.begin(), ids.end(), prompt_ids);
    if (!fed_host.empty()) io.to_exec(fed, fed_host.data(), fed_host.size() * 4);
    st.embed_batch(b, prompt_ids, fed, x);
    st.forward_batch(x, b);
    std::vector<SeqSampling> params;
    for (size_t j = 0; j < b.seqs.size(); ++j)
      if (b.seqs[j].gen_step >= 0) params.push_back(seqs[size_t(order[j])].sampling);
    st.choose_batch(x, b, sc.per_seq_sampling ? params.data() : nullptr, chosen, host_tokens);
    st.synchronize();
    xh.resize(size_t(b.rows() * hidden));
    io.from_exec(xh.data(), x, xh.size() * 4);
    int64_t row = 0, emit = 0;
    for (size_t j = 0; j < b.seqs.size(); ++j) {
      const BatchSeq& e = b.seqs[j];
      const int64_t i = order[j];
      for (int64_t r = 0; r < e.n_rows; ++r, ++row)
        out.rows[{i, e.first_pos + r}] = std::vector<float>(xh.begin() + row * hidden, xh.begin() + (row + 1) * hidden);
      if (!e.decode) done_prompt[size_t(i)] += e.n_rows;
      if (e.gen_step >= 0) out.tokens[size_t(i)].push_back(host_tokens[emit++]);
      if (int64_t(out.tokens[size_t(i)].size()) == K) {  // retire: its slot and pages go back
        slot_busy[size_t(slot_of[size_t(i)])] = false;
        slot_of[size_t(i)] = -2;
        for (int32_t p : pages_of[size_t(i)]) free_pages.insert(free_pages.begin(), p);
        ++finished;
      }
    }
    ++out.steps;
    out.mixed_steps += !dec.empty() && !pro.empty();
  }
  return out;
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

}  // namespace lfm2::test
