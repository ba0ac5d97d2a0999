// Continuous batching (issue 20): the scheduler of the first stage, vLLM V1's shape. Pure: no
// threads, no MPI, no executor; the job feeds it prompts and the tokens each item chose, and it
// answers with the plan of the next item (engine/step_plan.h).
//
// One decision per item, no prefill or decode "mode": a token budget (max_batched_tokens rows) is
// spent first on the running sequences' decode rows (one each, oldest first), then on prompt
// chunks: the running sequences' unfinished prompts, then new prompts admitted in arrival order
// while a slot (max_seqs) and the chunk's pages are free; while other sequences decode, admissions
// come in waves (admit_wave free slots at least: an item with prompt rows reads every expert's
// weights once more for them, which a prompt or two per item would pay at every step). A sequence
// is in at most one item at a time (its next row needs the token its last one chose; look-ahead
// below is the exception), so with P stages the running sequences spread over the P items in
// flight, at most max_seqs / P of them in each. A sequence retires at its EOS or its own
// max_new_tokens, giving its slot and pages to the next prompt. When the pool's pages run out, the youngest
// running sequence that is not in flight is preempted: its pages and slot are freed, it goes back
// to the front of the queue, and is later recomputed exactly as it was first computed (its prompt
// as prompt rows in any chunks, then each token it had chosen as a decode row of its own, forced:
// a position's bits depend on the kind of row that made it), so preemption changes no token.
//
// Pages and slots freed by an item's completion are reused by later items only: every stage runs
// items in order, and an item completes (its tokens come back) after every stage ran it.
//
// Look-ahead (one stage, vLLM V1's async scheduling): item i may be planned while item i - 1 runs.
// A sequence whose row in item i - 1 chooses a token gets its next decode row in item i, fed that
// token on the device (plan.fed_chosen: its index among item i - 1's chosen tokens), unless its own
// max_new_tokens ends it there. One that ends at an EOS chosen in item i - 1 then has one wasted row
// in item i: its token is dropped, and its slot and pages go back only once item i is done (the row
// writes its own pages only). So the GPU always has the next item queued, while the host reads
// item i - 1's tokens and plans item i + 1. Prompt chunks, forced rows and sequences not in item
// i - 1 are planned from what the host knows, as without look-ahead; the sampled path draws its
// tokens on the host inside item i - 1's choice and copies them to the device, so it plans the same
// way (and is exact the same way), only without the overlap.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include <functional>

#include "model/step_batch.h"
#include "rank/engine/step_plan.h"

namespace lfm2 {

struct SchedulerConfig {
  int64_t max_seqs = 1;            // slots: sequences running at once
  int64_t max_batched_tokens = 1;  // rows per item (decode rows + prompt rows)
  int64_t n_pages = 1;             // KV pages in the pool
  int64_t page_size = 16;          // positions per page
  int64_t max_pages = 1;           // pages one sequence may hold (the block table's width)
  int64_t max_in_flight = 1;       // items in flight at once (the pipeline's stages)
  int64_t max_item_seqs = 0;       // sequences per item (0: max_seqs / max_in_flight, rounded up, so
                                   // that the running sequences fill every item in flight)
  bool look_ahead = false;         // one more item in flight, fed on the device (one stage only)
  int64_t admit_wave = 0;          // while others decode, admissions wait for this many free slots
                                   // (0: max_seqs / 24, at least 1; see admission_opens)
  bool prefill_first = false;      // prompts waiting to start (a wave) or to finish run in items of
                                   // their own, the decode rows waiting (see prompts_pending)
  std::vector<int32_t> eos;        // a sequence ends after any of these
  bool per_sequence_sampling = false;  // plans carry each emitting entry's sampling
  // --stream: called with each token as it comes back (seq, token, false), then once more when the
  // sequence ends (seq, -1, true).
  std::function<void(int64_t seq, int32_t token, bool ended)> on_token;
};

// A prompt to run: its index in the inputs, its length, its own max_new_tokens and sampling.
struct SeqRequest {
  int64_t seq = 0;
  int32_t prompt_len = 0;
  int32_t max_new_tokens = 1;
  SeqSampling sampling;
};

// A sequence that ended, with its tokens (EOS included) and its times (the `now` of the calls).
struct FinishedSeq {
  int64_t seq = 0;
  std::vector<int32_t> tokens;
  bool ended_at_eos = false;
  double added_s = 0, first_token_s = 0, finished_s = 0;
  int32_t prompt_len = 0;
  int32_t preemptions = 0;
  int32_t n_tokens = 0;  // tokens.size() (kept where the tokens are moved out)
};

struct SchedulerStats {
  int64_t preemptions = 0;
  int64_t items = 0, decode_rows = 0, prompt_rows = 0, forced_rows = 0;
  int64_t slot_items = 0;  // sum over items of the sequences running (slot occupancy)
  int64_t kv_positions = 0;  // cached positions the decode rows read (the memory floor's KV bytes)
  int64_t ahead_rows = 0;    // decode rows fed on the device (look-ahead)
  int64_t wasted_rows = 0;   // of them, rows after their sequence's EOS (their tokens dropped)
  // every token after a sequence's first: the time since its previous token came back, as the host
  // sees it (vLLM's inter-token latency: the steady step, and in its tail the prompt items' stalls)
  std::vector<double> token_gaps_s;
  // each item's time from the one before it coming back (the first's from the first arrival), as the
  // host sees it, summed by kind: items holding prompt rows, and items of decode rows alone
  int64_t prompt_items_back = 0, decode_items_back = 0;
  double prompt_items_s = 0, decode_items_s = 0;
};

class BatchScheduler {
 public:
  explicit BatchScheduler(const SchedulerConfig& config);

  // Queues a prompt (arrival order). Throws, naming the sequence, when it can never run: its
  // positions exceed a slot's pages or the whole pool, or its parameters are out of range.
  void add(const SeqRequest& request, double now_s = 0);

  // Whether another item may be planned now (fewer than max_in_flight in flight, one more with
  // look-ahead).
  bool may_plan() const { return int64_t(flight_.size()) < cfg_.max_in_flight + (cfg_.look_ahead ? 1 : 0); }
  // The next item's plan (item number `item`) into *plan; false when nothing can run now (every
  // runnable sequence is in flight, or waits for pages or slots that in-flight items hold).
  bool plan(int64_t item, StepPlan* plan);
  // Item `item` came back: its emitting entries' tokens, in entry order.
  void complete(int64_t item, const int32_t* tokens, int64_t n, double now_s = 0);
  // The sequences that ended since the last call.
  std::vector<FinishedSeq> take_finished();

  bool done() const { return waiting_.empty() && running_.empty() && flight_.empty(); }
  int64_t n_in_flight() const { return int64_t(flight_.size()); }
  int64_t oldest_in_flight() const { return flight_.empty() ? -1 : flight_.begin()->first; }
  int64_t n_waiting() const { return int64_t(waiting_.size()); }
  int64_t n_running() const { return int64_t(running_.size()); }
  int64_t pages_in_use() const { return cfg_.n_pages - int64_t(free_pages_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  struct Seq {
    SeqRequest req;
    int32_t slot = -1;
    std::vector<int32_t> pages;
    int32_t computed = 0;            // positions in its KV cache (items done)
    int32_t planned = 0;             // with the rows of items in flight
    std::vector<int32_t> generated;  // tokens chosen so far (items done)
    int32_t in_flight = 0;           // its entries in items in flight (2 at most: look-ahead)
    int32_t ahead = 0;               // of them, those that choose a token
    int64_t last_item = -1;          // the item of its last entry
    int32_t last_emit = -1;          // that entry's index among the item's chosen tokens (-1: none)
    bool ended = false;              // its last token is chosen; retires once nothing is in flight
    int64_t admitted = -1;           // admission order (youngest: largest)
    double added_s = 0, first_token_s = -1, last_token_s = -1;
    int32_t preemptions = 0;
  };
  struct Entry {
    int64_t id;    // the sequence's key in seqs_
    int32_t rows;
    bool emits;
    bool prompt;   // a prompt chunk (else a decode row)
  };

  bool room(const StepPlan& p) const { return p.n_seqs() < cfg_.max_item_seqs; }
  bool prompts_pending() const;
  int64_t decode_rows(StepPlan& p, int64_t budget);
  int64_t ahead_rows(StepPlan& p, int64_t budget);
  void add_decode_entry(StepPlan& p, int64_t key, int32_t chosen_index);
  int64_t prompt_chunks(StepPlan& p, int64_t budget);
  bool admission_opens(const StepPlan& p) const;
  bool admit_one(StepPlan& p, int64_t& budget);
  void add_prompt_entry(StepPlan& p, int64_t key, int32_t n);
  bool grow(Seq& s, int64_t positions, StepPlan& p, bool may_preempt);
  bool preempt_youngest(const Seq& keep);
  int64_t preemptable_pages(const Seq& keep) const;
  void retire(int64_t id, double now_s);

  SchedulerConfig cfg_;
  std::map<int64_t, Seq> seqs_;        // every queued or running sequence, by its key
  std::deque<int64_t> waiting_;        // keys, in the order they run next
  std::vector<int64_t> running_;       // keys, oldest admission first
  std::vector<int32_t> free_pages_, free_slots_;
  std::map<int64_t, std::vector<Entry>> flight_;  // items in flight: their entries
  double last_back_s_ = -1;                          // the last item's return (first: the first arrival)
  std::vector<Entry> building_;                   // the entries of the item being planned
  std::vector<FinishedSeq> finished_;
  int64_t next_key_ = 0, next_admission_ = 0;
  SchedulerStats stats_;
};

}  // namespace lfm2
