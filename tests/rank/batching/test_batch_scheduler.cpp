// The continuous-batching scheduler without threads, MPI or a model: a fake pipeline of P items in
// flight completes items in order, choosing each token as a pure function of (sequence, step); a
// fake cache per slot, through the plans' page grants, checks that every row reads positions its
// own sequence wrote, and that every position is (re)computed by the kind of row that first made
// it, with the same token (exactness under preemption). With look-ahead, a decode row fed on the
// device reads the token the fake chose in the item before, which must still be in flight.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "rank/batching/batch_scheduler.h"
#include "rank/batching/metrics.h"

namespace lfm2 {
namespace {

constexpr int32_t kEos = 999;

// The token a sequence chooses at step t: EOS at step eos_at (if >= 0).
int32_t token_of(int64_t seq, int64_t t, int64_t eos_at) {
  return t == eos_at ? kEos : int32_t((seq * 31 + t * 7) % 500);
}

struct Prompt {
  int64_t seq;
  int32_t len, max_new;
  int64_t eos_at = -1;
};

// What a position holds in the fake cache: its sequence, and how it was made.
struct Cell {
  int64_t seq = -1;
  bool decode = false;
  int32_t token = -1;  // decode rows: the token fed
};

struct SimRun {
  std::map<int64_t, std::vector<int32_t>> tokens;  // per sequence, as finished
  SchedulerStats stats;
  int64_t items = 0, max_rows = 0, max_entries = 0, max_flight = 0;
  std::vector<int64_t> finish_order;
};

class FakePipeline {
 public:
  FakePipeline(const SchedulerConfig& cfg, const std::vector<Prompt>& prompts)
      : cfg_(cfg), prompts_(prompts), table_(size_t(cfg.max_seqs), std::vector<int32_t>(size_t(cfg.max_pages), -1)),
        pool_(size_t(cfg.n_pages * cfg.page_size)) {
    for (const Prompt& p : prompts) by_seq_[p.seq] = p;
  }

  SimRun run() {
    BatchScheduler sched(cfg_);
    for (const Prompt& p : prompts_) sched.add({p.seq, p.len, p.max_new, {}});
    SimRun r;
    std::deque<StepPlan> flight;
    int64_t item = 0;
    while (!sched.done()) {
      StepPlan plan;
      if (sched.may_plan() && sched.plan(item, &plan)) {
        check_and_apply(plan);
        r.max_rows = std::max(r.max_rows, plan.rows());
        r.max_entries = std::max(r.max_entries, plan.n_seqs());
        flight.push_back(std::move(plan));
        r.max_flight = std::max(r.max_flight, int64_t(flight.size()));
        ++item;
        continue;
      }
      EXPECT_FALSE(flight.empty()) << "nothing in flight, yet nothing planned";
      if (flight.empty()) break;
      const StepPlan done = std::move(flight.front());
      flight.pop_front();
      const std::vector<int32_t> chosen = chosen_.at(done.item);
      chosen_.erase(done.item);
      sched.complete(done.item, chosen.data(), int64_t(chosen.size()));
      for (FinishedSeq& f : sched.take_finished()) {
        r.finish_order.push_back(f.seq);
        r.tokens[f.seq] = f.tokens;
      }
    }
    r.items = item;
    r.stats = sched.stats();
    EXPECT_EQ(sched.pages_in_use(), 0);
    return r;
  }

 private:
  Cell& cell(int32_t slot, int64_t pos) {
    const int32_t page = table_[size_t(slot)][size_t(pos / cfg_.page_size)];
    EXPECT_GE(page, 0) << "slot " << slot << " position " << pos << " has no page";
    return pool_[size_t(std::max(page, 0) * cfg_.page_size + pos % cfg_.page_size)];
  }

  // Every row reads its sequence's earlier positions and writes its own; prompt rows make prompt
  // positions, decode rows the positions after, fed the token the sequence chose there.
  void check_and_apply(const StepPlan& p) {
    for (const PageGrant& g : p.grants) table_[size_t(g.slot)][size_t(g.index)] = g.page;
    EXPECT_LE(p.rows(), cfg_.max_batched_tokens);
    EXPECT_LE(p.n_seqs(), cfg_.max_seqs);
    EXPECT_EQ(int64_t(p.fed.size()), p.n_decode());
    EXPECT_TRUE(p.fed_chosen.empty() || int64_t(p.fed_chosen.size()) == p.n_decode());
    EXPECT_TRUE(p.fed_chosen.empty() || cfg_.look_ahead);
    const bool before_in_flight = chosen_.count(p.item - 1) > 0;
    std::set<int32_t> slots;
    size_t fed = 0;
    for (size_t k = 0; k < p.seqs.size(); ++k) {
      const SeqRows& s = p.seqs[k];
      EXPECT_TRUE(slots.insert(s.slot).second) << "slot " << s.slot << " twice in item " << p.item;
      EXPECT_TRUE(!s.decode || int64_t(k) < p.n_decode()) << "decode entries first";
      const Prompt& pr = by_seq_.at(s.seq);
      for (int64_t q = 0; q < s.first_pos; ++q) EXPECT_EQ(cell(s.slot, q).seq, s.seq) << "position " << q;
      for (int32_t j = 0; j < s.n_rows; ++j) {
        const int64_t pos = s.first_pos + j;
        int32_t token = s.decode ? p.fed[fed] : -1;
        if (s.decode && !p.fed_chosen.empty() && p.fed_chosen[fed] >= 0) {
          EXPECT_TRUE(before_in_flight) << "item " << p.item << " reads the tokens of an item done";
          const std::vector<int32_t>& before = chosen_[p.item - 1];
          EXPECT_LT(size_t(p.fed_chosen[fed]), before.size());
          token = before.at(std::min(size_t(p.fed_chosen[fed]), before.size() - 1));
          EXPECT_EQ(p.fed[fed], -1);
        }
        Cell c{s.seq, s.decode, token};
        EXPECT_EQ(s.decode, pos >= pr.len) << "sequence " << s.seq << " position " << pos;
        if (s.decode) {
          EXPECT_EQ(c.token, token_of(s.seq, pos - pr.len, pr.eos_at)) << "a forced or fed token";
        }
        const auto key = std::make_pair(s.seq, pos);
        const auto it = made_.find(key);
        if (it != made_.end()) {
          EXPECT_EQ(it->second.decode, c.decode) << "recomputed by another kind of row";
          EXPECT_EQ(it->second.token, c.token);
        }
        made_[key] = c;
        cell(s.slot, pos) = c;
      }
      if (s.decode) ++fed;
      // A row emits only the sequence's next new token.
      if (s.gen_step >= 0) {
        EXPECT_EQ(s.first_pos + s.n_rows, pr.len + s.gen_step);
        EXPECT_LT(s.gen_step, pr.max_new) << "sequence " << s.seq << ": a row past its own max_new_tokens";
      }
    }
    chosen_[p.item] = choose(p);
  }

  // A slot repeats its EOS after it (as the executors do): a row after an EOS chooses it again.
  std::vector<int32_t> choose(const StepPlan& p) {
    std::vector<int32_t> t;
    for (const SeqRows& s : p.seqs) {
      if (s.gen_step < 0) continue;
      const int64_t eos_at = by_seq_.at(s.seq).eos_at;
      t.push_back(eos_at >= 0 && s.gen_step > eos_at ? kEos : token_of(s.seq, s.gen_step, eos_at));
    }
    return t;
  }

  SchedulerConfig cfg_;
  std::vector<Prompt> prompts_;
  std::map<int64_t, Prompt> by_seq_;
  std::vector<std::vector<int32_t>> table_;  // (slot, logical page) -> page
  std::vector<Cell> pool_;
  std::map<std::pair<int64_t, int64_t>, Cell> made_;
  std::map<int64_t, std::vector<int32_t>> chosen_;  // items in flight: the tokens they choose
};

std::vector<int32_t> expected(const Prompt& p) {
  std::vector<int32_t> t;
  for (int64_t k = 0; k < p.max_new; ++k) {
    t.push_back(token_of(p.seq, k, p.eos_at));
    if (k == p.eos_at) break;
  }
  return t;
}

std::vector<Prompt> ragged(int64_t n, uint32_t seed) {
  std::vector<Prompt> v;
  uint32_t x = seed;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  for (int64_t s = 0; s < n; ++s) {
    Prompt p{s, int32_t(1 + next() % 37), int32_t(1 + next() % 23)};
    if (next() % 3 == 0) p.eos_at = int64_t(next() % uint32_t(p.max_new));
    v.push_back(p);
  }
  return v;
}

SchedulerConfig config(int64_t max_seqs, int64_t budget, int64_t pages, int64_t page_size, int64_t in_flight,
                       bool look_ahead = false) {
  SchedulerConfig c;
  c.max_seqs = max_seqs;
  c.max_batched_tokens = budget;
  c.n_pages = pages;
  c.page_size = page_size;
  c.max_pages = (37 + 23 + page_size - 1) / page_size;
  c.max_in_flight = in_flight;
  c.look_ahead = look_ahead;
  c.eos = {kEos};
  return c;
}

void expect_all(const SimRun& r, const std::vector<Prompt>& prompts, const std::string& what) {
  ASSERT_EQ(r.tokens.size(), prompts.size()) << what;
  for (const Prompt& p : prompts) EXPECT_EQ(r.tokens.at(p.seq), expected(p)) << what << ", sequence " << p.seq;
}

TEST(BatchScheduler, EverySequenceGetsItsOwnTokensWhateverTheLimits) {
  const auto prompts = ragged(60, 7);
  for (int64_t max_seqs : {1, 7, 64})
    for (int64_t budget : {1, 16, 4096})
      for (int64_t in_flight : {1, 3}) {
        const SimRun r = FakePipeline(config(max_seqs, budget, 4096, 16, in_flight), prompts).run();
        const std::string what = cat("max_seqs ", max_seqs, ", budget ", budget, ", ", in_flight, " in flight");
        expect_all(r, prompts, what);
        EXPECT_EQ(r.stats.preemptions, 0) << what;
        EXPECT_LE(r.max_entries, (max_seqs + in_flight - 1) / in_flight) << what << ": every item in flight gets a share";
        EXPECT_LE(r.max_flight, in_flight) << what;
      }
}

TEST(BatchScheduler, ATinyPoolPreemptsAndChangesNoToken) {
  const auto prompts = ragged(40, 11);
  for (int64_t page_size : {1, 4, 16})
    for (int64_t in_flight : {1, 2}) {
      // Just enough pages for the longest sequence.
      const int64_t pages = (37 + 23 + page_size - 1) / page_size;
      const SimRun r = FakePipeline(config(8, 64, pages, page_size, in_flight), prompts).run();
      const std::string what = cat("pages of ", page_size, ", ", in_flight, " in flight");
      expect_all(r, prompts, what);
      EXPECT_GT(r.stats.preemptions, 0) << what;
      EXPECT_GT(r.stats.forced_rows, 0) << what << ": a preempted sequence's tokens are fed again";
    }
}

TEST(BatchScheduler, DecodeRowsComeFirstThenPromptChunksInTheBudget) {
  SchedulerConfig c = config(4, 10, 64, 4, 1);
  BatchScheduler s(c);
  s.add({0, 25, 3, {}});
  s.add({1, 3, 2, {}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));
  ASSERT_EQ(p.seqs.size(), 1u);  // a chunk of 10 of sequence 0's 25
  EXPECT_EQ(p.seqs[0].n_rows, 10);
  EXPECT_EQ(p.seqs[0].gen_step, -1);
  EXPECT_EQ(p.grants.size(), 3u);  // positions 0-9: pages of 4
  EXPECT_FALSE(s.may_plan());
  s.complete(0, nullptr, 0);
  ASSERT_TRUE(s.plan(1, &p));  // the next 10: the budget is spent before sequence 1 is admitted
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].first_pos, 10);
  EXPECT_EQ(p.seqs[0].n_rows, 10);
  s.complete(1, nullptr, 0);
  ASSERT_TRUE(s.plan(2, &p));  // its last 5 (its first token), then all 3 of sequence 1
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].n_rows, 5);
  EXPECT_EQ(p.seqs[0].gen_step, 0);
  EXPECT_EQ(p.seqs[1].seq, 1);
  EXPECT_EQ(p.seqs[1].n_rows, 3);
  const int32_t t2[] = {8, 9};
  s.complete(2, t2, 2);
  ASSERT_TRUE(s.plan(3, &p));
  EXPECT_EQ(p.kind, StepPlan::Kind::kDecode);
  EXPECT_EQ(p.fed, (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(p.seqs[0].first_pos, 25);
  EXPECT_EQ(p.seqs[1].first_pos, 3);
}

TEST(BatchScheduler, FirstTokenComesWithThePromptsLastChunkAndDecodeRowsLeadTheNextItem) {
  BatchScheduler s(config(4, 8, 64, 4, 1));
  s.add({5, 6, 3, {}});
  s.add({6, 5, 2, {}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.kind, StepPlan::Kind::kPrefill);
  EXPECT_EQ(p.seqs[0].gen_step, 0);  // all 6 of sequence 5
  EXPECT_EQ(p.seqs[1].n_rows, 2);    // 2 of sequence 6's 5: no token yet
  EXPECT_EQ(p.seqs[1].gen_step, -1);
  const int32_t t0[] = {42};
  s.complete(0, t0, 1);
  ASSERT_TRUE(s.plan(1, &p));
  EXPECT_EQ(p.kind, StepPlan::Kind::kMixed);
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_TRUE(p.seqs[0].decode);
  EXPECT_EQ(p.seqs[0].first_pos, 6);
  EXPECT_EQ(p.seqs[0].gen_step, 1);
  EXPECT_EQ(p.fed, std::vector<int32_t>{42});
  EXPECT_EQ(p.seqs[1].first_pos, 2);
  EXPECT_EQ(p.seqs[1].n_rows, 3);
  EXPECT_EQ(p.seqs[1].gen_step, 0);
  EXPECT_TRUE(p.reports);
  EXPECT_EQ(p.micro, -1);
}

// While others decode, new prompts wait for admit_wave free slots and then come together (a step
// with prompt rows reads the experts once more); the tokens are the same for any wave.
TEST(BatchScheduler, AdmissionsComeInWavesWhileOthersDecode) {
  SchedulerConfig c = config(4, 64, 64, 4, 1);
  c.admit_wave = 2;
  BatchScheduler s(c);
  s.add({0, 2, 2, {}});
  for (int64_t q = 1; q < 4; ++q) s.add({q, 2, 4, {}});
  s.add({4, 2, 2, {}});
  s.add({5, 2, 2, {}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));
  EXPECT_EQ(p.n_seqs(), 4);  // every slot free: four admitted
  const int32_t t4[] = {1, 2, 3, 4};
  s.complete(0, t4, 4);
  ASSERT_TRUE(s.plan(1, &p));
  EXPECT_EQ(p.n_decode(), 4);
  s.complete(1, t4, 4);  // sequence 0's second token: it retires, one slot free
  ASSERT_TRUE(s.plan(2, &p));
  EXPECT_EQ(p.n_seqs(), 3);  // one free slot of the wave's two: decode rows alone
  EXPECT_EQ(p.n_decode(), 3);
  s.complete(2, t4, 3);
  ASSERT_TRUE(s.plan(3, &p));  // still one free slot
  EXPECT_EQ(p.n_seqs(), 3);
  s.complete(3, t4, 3);  // sequences 1-3 end: three free
  ASSERT_TRUE(s.plan(4, &p));
  ASSERT_EQ(p.n_seqs(), 2);  // sequences 4 and 5 together
  EXPECT_EQ(p.seqs[0].seq, 4);
  EXPECT_EQ(p.seqs[1].seq, 5);
  const auto prompts = ragged(60, 5);
  for (int64_t wave : {1, 3, 16}) {
    SchedulerConfig w = config(16, 64, 4096, 16, 2);
    w.admit_wave = wave;
    expect_all(FakePipeline(w, prompts).run(), prompts, cat("admit_wave ", wave));
  }
}

// Prefill first: a wave of prompts (or a prompt's next chunk) gets items of its own while the
// running sequences' decode rows wait; items of decode rows resume once no prompt row is due. The
// tokens are the same as with mixed items (P = 1 with look-ahead, P = 2, preemption).
TEST(BatchScheduler, PrefillFirstGivesDuePromptsItemsOfTheirOwn) {
  SchedulerConfig c = config(4, 5, 64, 4, 1);
  c.admit_wave = 2;
  c.prefill_first = true;
  BatchScheduler s(c);
  s.add({0, 2, 4, {}});
  s.add({1, 7, 4, {}});  // a prompt in two chunks of the budget (5 + 2)
  s.add({2, 2, 4, {}});
  StepPlan p;
  const int32_t t[] = {1, 2, 3, 4};
  ASSERT_TRUE(s.plan(0, &p));  // prompt 0 whole, 3 rows of prompt 1
  EXPECT_EQ(p.n_decode(), 0);
  EXPECT_EQ(p.rows(), 5);
  s.complete(0, t, 1);
  ASSERT_TRUE(s.plan(1, &p));  // prompt 1's other 4 rows, prompt 2's first; sequence 0's decode waits
  EXPECT_EQ(p.n_decode(), 0);
  ASSERT_EQ(p.n_seqs(), 2);
  EXPECT_EQ(p.seqs[0].seq, 1);
  EXPECT_EQ(p.seqs[1].seq, 2);
  EXPECT_EQ(p.seqs[1].n_rows, 1);
  s.complete(1, t, 1);
  ASSERT_TRUE(s.plan(2, &p));  // prompt 2's last row alone
  EXPECT_EQ(p.n_decode(), 0);
  EXPECT_EQ(p.rows(), 1);
  s.complete(2, t, 1);
  ASSERT_TRUE(s.plan(3, &p));  // nothing due: the three decode together
  EXPECT_EQ(p.n_decode(), 3);
  EXPECT_EQ(p.n_seqs(), 3);
  const auto prompts = ragged(60, 7);
  SchedulerConfig mixed = config(8, 16, 4096, 16, 1, true);
  const SimRun ref = FakePipeline(mixed, prompts).run();
  expect_all(ref, prompts, "mixed");
  for (const auto& [name, cfg] : {std::pair{"P 1, look-ahead", config(8, 16, 4096, 16, 1, true)},
                                  std::pair{"P 2", config(8, 16, 4096, 16, 2)},
                                  std::pair{"preemption", config(8, 16, 24, 4, 1)}}) {
    SchedulerConfig f = cfg;
    f.prefill_first = true;
    f.admit_wave = 3;
    const SimRun got = FakePipeline(f, prompts).run();
    expect_all(got, prompts, cat("prefill first, ", name));
    EXPECT_EQ(got.tokens, ref.tokens) << name;
    if (std::string(name) == "preemption") {
      EXPECT_GT(got.stats.preemptions, 0);
    }
  }
}

// The inter-token latency: each token after a sequence's first, the time since its previous one came
// back (a prompt item between them counts in its gap); the items' times by kind; the metrics'
// quantiles and benchmark lines.
TEST(BatchScheduler, InterTokenGapsAreTheTimesBetweenASequencesTokens) {
  SchedulerConfig c = config(4, 5, 64, 4, 1);
  c.prefill_first = true;
  c.admit_wave = 1;
  BatchScheduler s(c);
  s.add({0, 2, 3, {}});
  s.add({1, 2, 3, {}});
  const int32_t t[] = {1, 2};
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));  // both prompts: their first tokens at 1.0 (no gap)
  ASSERT_EQ(p.n_decode(), 0);
  s.complete(0, t, 2, 1.0);
  EXPECT_TRUE(s.stats().token_gaps_s.empty());
  s.add({2, 3, 2, {}});        // a prompt arriving: its item of its own stalls the two (prefill first)
  ASSERT_TRUE(s.plan(1, &p));
  ASSERT_EQ(p.n_decode(), 0);
  s.complete(1, t, 1, 4.0);    // sequence 2's first token
  ASSERT_TRUE(s.plan(2, &p));  // the three decode
  ASSERT_EQ(p.n_decode(), 3);
  s.complete(2, t, 3, 4.5);    // gaps 3.5, 3.5 (the stall) and 0.5
  ASSERT_TRUE(s.plan(3, &p));  // sequences 0 and 1 for their last tokens (2 ended)
  ASSERT_EQ(p.n_decode(), 2);
  s.complete(3, t, 2, 5.0);    // gaps 0.5, 0.5
  const std::vector<double> want{3.5, 3.5, 0.5, 0.5, 0.5};
  EXPECT_EQ(s.stats().token_gaps_s, want);
  // the items' times by kind, from the first arrival (0): prompt items 1.0 + 3.0, decode 0.5 + 0.5
  EXPECT_EQ(s.stats().prompt_items_back, 2);
  EXPECT_DOUBLE_EQ(s.stats().prompt_items_s, 4.0);
  EXPECT_EQ(s.stats().decode_items_back, 2);
  EXPECT_DOUBLE_EQ(s.stats().decode_items_s, 1.0);
  const RunMetrics m = run_metrics({}, s.stats(), 4, 5.0);
  EXPECT_EQ(m.itl_s.n, 5);
  EXPECT_DOUBLE_EQ(m.itl_s.mean, 1.7);
  EXPECT_DOUBLE_EQ(m.itl_s.p50, 0.5);
  EXPECT_DOUBLE_EQ(m.itl_s.max, 3.5);
  const auto lines = benchmark_lines(m, 3, 1);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("inter-token latency") != std::string::npos && l.find("p50 500.00 ms") != std::string::npos;
  })) << "no inter-token latency line";
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("2 with prompt rows in 4.000 s (2000.00 ms each), 2 of decode rows alone in 1.000 s (500.00 ms "
                  "each)") != std::string::npos;
  })) << "no steps line";
  // and --metrics' JSON
  const std::string path =
      (std::filesystem::temp_directory_path() / ("lfm2_itl_" + std::to_string(::getpid()) + ".json")).string();
  write_metrics(path, m);
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  EXPECT_EQ(j["inter_token_latency_s"]["n"], 5);
  EXPECT_DOUBLE_EQ(j["inter_token_latency_s"]["p50"].get<double>(), 0.5);
  EXPECT_EQ(j["prompt_steps_replica0"]["n"], 2);
  EXPECT_DOUBLE_EQ(j["prompt_steps_replica0"]["s"].get<double>(), 4.0);
  EXPECT_EQ(j["decode_steps_replica0"]["n"], 2);
  EXPECT_DOUBLE_EQ(j["decode_steps_replica0"]["s"].get<double>(), 1.0);
}

TEST(BatchScheduler, RetirementFreesTheSlotForTheNextPrompt) {
  BatchScheduler s(config(1, 64, 64, 4, 1));
  s.add({0, 4, 1, {}});
  s.add({1, 4, 1, {}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));
  EXPECT_EQ(p.n_seqs(), 1);  // one slot
  const int32_t t[] = {3};
  s.complete(0, t, 1);
  const auto f = s.take_finished();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].seq, 0);
  ASSERT_TRUE(s.plan(1, &p));
  EXPECT_EQ(p.seqs[0].seq, 1);
  EXPECT_EQ(p.seqs[0].slot, 0);
}

TEST(BatchScheduler, WhatCanNeverRunIsRefusedNamingTheSequence) {
  BatchScheduler s(config(4, 64, 4, 4, 1));  // a pool of 16 positions
  EXPECT_THROW(s.add({3, 16, 2, {}}), Error);
  try {
    s.add({3, 16, 2, {}});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.add({4, 0, 2, {}}), Error);
  EXPECT_THROW(s.add({5, 3, 0, {}}), Error);
  EXPECT_NO_THROW(s.add({6, 15, 2, {}}));
}

TEST(BatchScheduler, PerSequenceSamplingTravelsWithEachEmittingEntry) {
  SchedulerConfig c = config(4, 64, 64, 4, 1);
  c.per_sequence_sampling = true;
  BatchScheduler s(c);
  s.add({0, 3, 2, {0.5f, 7, 0.8f, 11}});
  s.add({1, 3, 2, {0, 0, 1, 12}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));
  ASSERT_EQ(p.sampling.size(), 2u);
  EXPECT_EQ(p.sampling[0].top_k, 7);
  EXPECT_EQ(p.sampling[1].seed, 12u);
}

// Look-ahead (one stage): the same tokens for every limit and under preemption, two items in flight,
// the rows after an EOS wasted and none past a sequence's own max_new_tokens (the fake checks each
// row's position, fed token and step).
TEST(BatchScheduler, LookAheadChangesNoTokenWhateverTheLimits) {
  const auto prompts = ragged(60, 7);
  int64_t wasted = 0;
  for (int64_t max_seqs : {1, 7, 64})
    for (int64_t budget : {1, 16, 4096}) {
      const SimRun r = FakePipeline(config(max_seqs, budget, 4096, 16, 1, true), prompts).run();
      const std::string what = cat("max_seqs ", max_seqs, ", budget ", budget);
      expect_all(r, prompts, what);
      EXPECT_EQ(r.max_flight, 2) << what;
      EXPECT_LE(r.max_entries, max_seqs) << what << ": one stage, every running sequence in each item";
      EXPECT_GT(r.stats.ahead_rows, 0) << what;
      EXPECT_LE(r.stats.wasted_rows, r.stats.ahead_rows) << what;
      wasted += r.stats.wasted_rows;
    }
  EXPECT_GT(wasted, 0) << "no sequence ended at an EOS with a row ahead";
  for (int64_t page_size : {1, 4, 16}) {
    const int64_t pages = (37 + 23 + page_size - 1) / page_size;
    const SimRun r = FakePipeline(config(8, 64, pages, page_size, 1, true), prompts).run();
    const std::string what = cat("a tiny pool, pages of ", page_size);
    expect_all(r, prompts, what);
    EXPECT_GT(r.stats.preemptions, 0) << what;
    EXPECT_GT(r.stats.ahead_rows, 0) << what;
  }
}

// Two sequences of 3 new tokens each, the first ending at an EOS at once: item 1 is planned while
// item 0 runs, both rows fed from item 0's tokens on the device; the sequence that chose its EOS
// wastes its row there and retires only when item 1 is done; the other gets no row past its third
// token.
TEST(BatchScheduler, LookAheadFeedsTheItemBeforesTokensAndWastesOneRowAfterAnEos) {
  BatchScheduler s(config(4, 64, 64, 4, 1, true));
  s.add({0, 3, 3, {}});
  s.add({1, 3, 3, {}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));
  EXPECT_TRUE(p.fed_chosen.empty());
  ASSERT_TRUE(s.may_plan());
  ASSERT_TRUE(s.plan(1, &p));
  EXPECT_EQ(p.kind, StepPlan::Kind::kDecode);
  EXPECT_EQ(p.fed_chosen, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(p.fed, (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(p.seqs[0].first_pos, 3);
  EXPECT_EQ(p.seqs[0].gen_step, 1);
  EXPECT_FALSE(s.may_plan());  // two in flight
  const int32_t t0[] = {kEos, 10};
  s.complete(0, t0, 2);
  EXPECT_TRUE(s.take_finished().empty()) << "sequence 0 still has a row in flight";
  ASSERT_TRUE(s.plan(2, &p));  // sequence 1 only: sequence 0 has ended
  ASSERT_EQ(p.n_seqs(), 1);
  EXPECT_EQ(p.seqs[0].seq, 1);
  EXPECT_EQ(p.seqs[0].gen_step, 2);
  EXPECT_EQ(p.fed_chosen, std::vector<int32_t>{1});  // its token among item 1's
  const int32_t t1[] = {kEos, 11};
  s.complete(1, t1, 2);
  auto f = s.take_finished();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].seq, 0);
  EXPECT_EQ(f[0].tokens, std::vector<int32_t>{kEos});
  EXPECT_TRUE(f[0].ended_at_eos);
  EXPECT_EQ(s.stats().wasted_rows, 1);
  EXPECT_FALSE(s.plan(3, &p)) << "sequence 1's third token is its last: no row after it";
  const int32_t t2[] = {12};
  s.complete(2, t2, 1);
  f = s.take_finished();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].tokens, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.pages_in_use(), 0);
}

// A sequence not in the item before (its prompt chunk did not choose a token, or that item is done)
// is fed from the host, after the rows fed on the device; items come back in order.
TEST(BatchScheduler, LookAheadFeedsFromTheHostWhatTheItemBeforeDidNotChoose) {
  BatchScheduler s(config(4, 8, 64, 4, 1, true));
  s.add({0, 2, 4, {}});
  s.add({1, 10, 4, {}});
  StepPlan p;
  ASSERT_TRUE(s.plan(0, &p));  // all of 0 (a token), 6 of 1's 10
  ASSERT_EQ(p.n_seqs(), 2);
  ASSERT_TRUE(s.plan(1, &p));  // 0's row fed on the device; 1 waits for its chunk
  ASSERT_EQ(p.n_seqs(), 1);
  EXPECT_EQ(p.fed_chosen, std::vector<int32_t>{0});
  EXPECT_THROW(s.complete(1, nullptr, 0), Error);
  const int32_t t0[] = {20};
  s.complete(0, t0, 1);
  ASSERT_TRUE(s.plan(2, &p));  // 0 again from item 1; 1's last 4 rows
  EXPECT_EQ(p.fed_chosen, std::vector<int32_t>{0});
  EXPECT_EQ(p.seqs[1].seq, 1);
  EXPECT_EQ(p.seqs[1].n_rows, 4);
  const int32_t t1[] = {21};
  s.complete(1, t1, 1);
  const int32_t t2[] = {22, 30};
  s.complete(2, t2, 2);
  ASSERT_TRUE(s.plan(3, &p));  // nothing in flight: both fed from the host
  EXPECT_TRUE(p.fed_chosen.empty());
  EXPECT_EQ(p.fed, (std::vector<int32_t>{22, 30}));
}

}  // namespace
}  // namespace lfm2
