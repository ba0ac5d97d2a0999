#include "rank/batching/batch_scheduler.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace lfm2 {
namespace {

int64_t pages_for(int64_t positions, int64_t page_size) { return (positions + page_size - 1) / page_size; }

}  // namespace

BatchScheduler::BatchScheduler(const SchedulerConfig& config) : cfg_(config) {
  LFM2_CHECK(cfg_.max_seqs >= 1 && cfg_.max_batched_tokens >= 1 && cfg_.n_pages >= 1 && cfg_.page_size >= 1 &&
                 cfg_.max_pages >= 1 && cfg_.max_in_flight >= 1,
             "scheduler: max_seqs ", cfg_.max_seqs, ", max_batched_tokens ", cfg_.max_batched_tokens, ", ",
             cfg_.n_pages, " pages of ", cfg_.page_size, " (", cfg_.max_pages, " a sequence), ", cfg_.max_in_flight,
             " items in flight");
  LFM2_CHECK(cfg_.n_pages <= INT32_MAX && cfg_.max_seqs <= INT32_MAX, "scheduler: too many pages or slots");
  if (cfg_.admit_wave <= 0) cfg_.admit_wave = std::max<int64_t>(1, cfg_.max_seqs / 24);
  // With look-ahead the same sequences fill the item in flight and the next: max_in_flight still
  // counts the stages.
  if (cfg_.max_item_seqs <= 0) cfg_.max_item_seqs = (cfg_.max_seqs + cfg_.max_in_flight - 1) / cfg_.max_in_flight;
  // Lowest first: a pop from the back takes the lowest.
  for (int64_t p = cfg_.n_pages - 1; p >= 0; --p) free_pages_.push_back(int32_t(p));
  for (int64_t s = cfg_.max_seqs - 1; s >= 0; --s) free_slots_.push_back(int32_t(s));
}

void BatchScheduler::add(const SeqRequest& r, double now_s) {
  const int64_t positions = int64_t(r.prompt_len) + r.max_new_tokens - 1;
  LFM2_CHECK(r.prompt_len >= 1, "sequence ", r.seq, ": an empty prompt");
  LFM2_CHECK(r.max_new_tokens >= 1, "sequence ", r.seq, ": max_new_tokens ", r.max_new_tokens, " (at least 1)");
  LFM2_CHECK(positions <= cfg_.max_pages * cfg_.page_size, "sequence ", r.seq, ": ", r.prompt_len,
             " prompt tokens + ", r.max_new_tokens, " new need ", positions, " positions, a sequence may hold ",
             cfg_.max_pages * cfg_.page_size);
  LFM2_CHECK(pages_for(positions, cfg_.page_size) <= cfg_.n_pages, "sequence ", r.seq, ": ", r.prompt_len,
             " prompt tokens + ", r.max_new_tokens, " new need ", pages_for(positions, cfg_.page_size),
             " KV pages, the pool holds ", cfg_.n_pages, " (a prompt longer than the pool can ever hold)");
  if (last_back_s_ < 0) last_back_s_ = now_s;
  Seq s;
  s.req = r;
  s.added_s = now_s;
  const int64_t key = next_key_++;
  seqs_.emplace(key, std::move(s));
  waiting_.push_back(key);
}

bool BatchScheduler::plan(int64_t item, StepPlan* out) {
  LFM2_CHECK(may_plan(), "scheduler: ", flight_.size(), " items already in flight");
  StepPlan p;
  p.item = item;
  p.micro = -1;
  p.reports = true;
  int64_t budget = cfg_.max_batched_tokens;
  if (cfg_.prefill_first && prompts_pending()) prompt_chunks(p, budget);
  if (p.seqs.empty()) {
    if (cfg_.look_ahead) budget -= ahead_rows(p, budget);
    budget -= decode_rows(p, budget);
    prompt_chunks(p, budget);
  }
  if (p.seqs.empty()) return false;
  if (std::all_of(p.fed_chosen.begin(), p.fed_chosen.end(), [](int32_t k) { return k < 0; })) p.fed_chosen.clear();
  p.kind = generation_kind(p.seqs);
  int32_t emitted = 0;  // each entry's index among the item's chosen tokens
  for (const Entry& e : building_) {
    Seq& s = seqs_.at(e.id);
    s.last_item = item;
    s.last_emit = e.emits ? emitted++ : -1;
  }
  flight_[item] = std::move(building_);
  building_.clear();
  ++stats_.items;
  stats_.slot_items += int64_t(running_.size());
  *out = std::move(p);
  return true;
}

// Prefill first (vLLM V0's order, SchedulerConfig::prefill_first): whether prompt rows are due - a
// running sequence's unfinished prompt, or a wave of waiting prompts whose slots are free. The
// item then holds prompt chunks only, and the decode rows wait for the next; if none of them can
// be planned now (in flight, or short of pages) the item is planned as usual. A wave of long prompts
// then runs back to back and its sequences decode together, as the static schedule's, where mixing
// would start them apart and end them apart (the last steps running a few rows over every weight).
bool BatchScheduler::prompts_pending() const {
  for (int64_t key : running_) {
    const Seq& s = seqs_.at(key);
    if (s.in_flight == 0 && s.computed < s.req.prompt_len) return true;
  }
  return !waiting_.empty() && !free_slots_.empty() &&
         int64_t(free_slots_.size()) >= std::min<int64_t>(cfg_.admit_wave, int64_t(waiting_.size()));
}

// Look-ahead: the next decode row of each sequence whose row in the item before (still in flight)
// chooses a token, in that item's order of chosen tokens (so that their fed tokens are runs of its
// buffer), unless that token is its last by its own max_new_tokens.
int64_t BatchScheduler::ahead_rows(StepPlan& p, int64_t budget) {
  const auto before = flight_.find(p.item - 1);
  if (before == flight_.end()) return 0;
  int64_t used = 0;
  for (const Entry& e : before->second) {
    if (used >= budget || !room(p)) break;
    Seq& s = seqs_.at(e.id);
    if (!e.emits || s.ended || s.in_flight != 1 || s.last_item != p.item - 1) continue;
    if (int64_t(s.generated.size()) + s.ahead >= s.req.max_new_tokens) continue;
    if (!grow(s, int64_t(s.planned) + 1, p, true)) continue;
    add_decode_entry(p, e.id, s.last_emit);
    ++used;
  }
  return used;
}

// Decode rows of the running sequences past their prompt that are not in flight, oldest first: their
// tokens are on the host.
int64_t BatchScheduler::decode_rows(StepPlan& p, int64_t budget) {
  int64_t used = 0;
  for (size_t i = 0; i < running_.size() && used < budget && room(p); ++i) {
    const int64_t key = running_[i];
    Seq& s = seqs_.at(key);
    if (s.in_flight > 0 || s.computed < s.req.prompt_len) continue;
    if (!grow(s, int64_t(s.computed) + 1, p, true)) continue;
    add_decode_entry(p, key, -1);
    ++used;
  }
  return used;
}

// One decode row at the sequence's next position, fed its token chosen in the item before
// (chosen_index >= 0: on the device) or the host's (a forced row when it is not its newest token).
void BatchScheduler::add_decode_entry(StepPlan& p, int64_t key, int32_t chosen_index) {
  Seq& s = seqs_.at(key);
  const int32_t known = int32_t(s.generated.size()) + s.ahead;  // tokens chosen or being chosen
  const int32_t fed_index = s.planned - s.req.prompt_len;
  LFM2_CHECK(fed_index >= 0 && fed_index < known, "scheduler: sequence ", s.req.seq, " has no token to feed");
  const bool emits = fed_index + 1 == known;
  p.seqs.push_back({s.req.seq, s.slot, s.planned, 1, 1, emits ? fed_index + 1 : -1, true});
  p.fed.push_back(chosen_index >= 0 ? -1 : s.generated[size_t(fed_index)]);
  if (cfg_.look_ahead) p.fed_chosen.push_back(chosen_index);
  if (emits && cfg_.per_sequence_sampling) p.sampling.push_back(s.req.sampling);
  building_.push_back({key, 1, emits, false});
  ++(emits ? stats_.decode_rows : stats_.forced_rows);
  if (chosen_index >= 0) ++stats_.ahead_rows;
  stats_.kv_positions += s.planned;
  s.planned += 1;
  s.ahead += emits ? 1 : 0;
  ++s.in_flight;
}

// Prompt chunks: the running sequences' unfinished prompts (oldest first), then new admissions.
int64_t BatchScheduler::prompt_chunks(StepPlan& p, int64_t budget) {
  const int64_t start = budget;
  for (size_t i = 0; i < running_.size() && budget > 0 && room(p); ++i) {
    Seq& s = seqs_.at(running_[i]);
    if (s.in_flight > 0 || s.computed >= s.req.prompt_len) continue;
    int32_t n = int32_t(std::min<int64_t>(s.req.prompt_len - s.computed, budget));
    if (!grow(s, int64_t(s.computed) + n, p, true)) {
      // As many rows as its pages cover.
      n = int32_t(std::min<int64_t>(n, int64_t(s.pages.size()) * cfg_.page_size - s.computed));
      if (n <= 0) continue;
    }
    add_prompt_entry(p, running_[i], n);
    budget -= n;
  }
  if (!admission_opens(p)) return start - budget;
  while (budget > 0 && room(p) && admit_one(p, budget)) {
  }
  return start - budget;
}

// Whether this item admits new prompts. An item of decode rows alone runs each layer's experts once
// (the decode kernel); prompt rows add a second pass over every expert's weights, the same cost for
// one prompt as for many. So while sequences decode and no prompt rows are in the item yet, new
// prompts wait until admit_wave slots are free (or as many as are waiting), and then come together.
// The tokens do not depend on it (a row's bits never depend on the rows beside it).
bool BatchScheduler::admission_opens(const StepPlan& p) const {
  if (p.n_decode() == 0 || p.n_decode() < p.n_seqs()) return true;
  return int64_t(free_slots_.size()) >= std::min<int64_t>(cfg_.admit_wave, int64_t(waiting_.size()));
}

// Admits the next waiting sequence with its first chunk, when a slot and the chunk's pages are free
// (an admission never preempts).
bool BatchScheduler::admit_one(StepPlan& p, int64_t& budget) {
  if (waiting_.empty() || free_slots_.empty()) return false;
  const int64_t key = waiting_.front();
  Seq& s = seqs_.at(key);
  const int32_t n = int32_t(std::min<int64_t>(s.req.prompt_len, budget));
  if (pages_for(n, cfg_.page_size) > int64_t(free_pages_.size())) return false;
  waiting_.pop_front();
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  s.admitted = next_admission_++;
  s.computed = s.planned = 0;
  running_.push_back(key);
  grow(s, n, p, false);
  add_prompt_entry(p, key, n);
  budget -= n;
  return true;
}

void BatchScheduler::add_prompt_entry(StepPlan& p, int64_t key, int32_t n) {
  Seq& s = seqs_.at(key);
  const bool emits = s.computed + n == s.req.prompt_len && s.generated.empty();
  p.seqs.push_back({s.req.seq, s.slot, s.computed, n, n, emits ? 0 : -1, false});
  if (emits && cfg_.per_sequence_sampling) p.sampling.push_back(s.req.sampling);
  building_.push_back({key, n, emits, true});
  stats_.prompt_rows += n;
  s.planned += n;
  s.ahead += emits ? 1 : 0;
  ++s.in_flight;
}

// Gives s the pages that cover `positions`, granted in p; when the pool is short, preempts the
// youngest running sequences not in flight (may_preempt). False if the pages cannot be had now; then
// nobody is preempted (a preemption that would not give s its pages would only be undone later,
// and with prefill_first could repeat forever: the victim readmitted, preempted again).
bool BatchScheduler::grow(Seq& s, int64_t positions, StepPlan& p, bool may_preempt) {
  const int64_t need = pages_for(positions, cfg_.page_size) - int64_t(s.pages.size());
  if (need <= 0) return true;
  const int64_t free = int64_t(free_pages_.size());
  if (free < need && (!may_preempt || free + preemptable_pages(s) < need)) return false;
  while (int64_t(free_pages_.size()) < need) LFM2_CHECK(preempt_youngest(s), "scheduler: preemption fell short");
  for (int64_t k = 0; k < need; ++k) {
    const int32_t page = free_pages_.back();
    free_pages_.pop_back();
    p.grants.push_back({s.slot, int32_t(s.pages.size()), page});
    s.pages.push_back(page);
  }
  return true;
}

// The pages preempt_youngest could free for `keep`: those of the running sequences younger than it
// that are not in flight.
int64_t BatchScheduler::preemptable_pages(const Seq& keep) const {
  int64_t n = 0;
  for (size_t i = running_.size(); i-- > 0;) {
    const Seq& v = seqs_.at(running_[i]);
    if (v.admitted <= keep.admitted) break;
    if (v.in_flight == 0) n += int64_t(v.pages.size());
  }
  return n;
}

// The youngest running sequence younger than `keep` that is not in flight (nor planned in the item
// being built) loses its pages and slot and goes back to the front of the queue. (Never an older
// one: the oldest running sequence always makes progress.)
bool BatchScheduler::preempt_youngest(const Seq& keep) {
  for (size_t i = running_.size(); i-- > 0;) {
    Seq& v = seqs_.at(running_[i]);
    if (v.admitted <= keep.admitted) return false;
    if (v.in_flight > 0) continue;
    for (int32_t pg : v.pages) free_pages_.push_back(pg);
    v.pages.clear();
    free_slots_.push_back(v.slot);
    v.slot = -1;
    v.computed = v.planned = 0;
    ++v.preemptions;
    ++stats_.preemptions;
    waiting_.push_front(running_[i]);
    running_.erase(running_.begin() + int64_t(i));
    return true;
  }
  return false;
}

void BatchScheduler::complete(int64_t item, const int32_t* tokens, int64_t n, double now_s) {
  const auto it = flight_.find(item);
  LFM2_CHECK(it != flight_.end(), "scheduler: item ", item, " is not in flight");
  LFM2_CHECK(item == flight_.begin()->first, "scheduler: item ", item, " came back before item ",
             flight_.begin()->first);
  int64_t t = 0;
  for (const Entry& e : it->second) {
    Seq& s = seqs_.at(e.id);
    --s.in_flight;
    s.computed += e.rows;
    if (!e.emits) continue;
    LFM2_CHECK(t < n, "scheduler: item ", item, " came back with ", n, " tokens, fewer than it emits");
    const int32_t token = tokens[t++];
    --s.ahead;
    if (s.ended) {  // a look-ahead row after its EOS: the token is dropped
      ++stats_.wasted_rows;
      continue;
    }
    s.generated.push_back(token);
    if (s.first_token_s < 0) s.first_token_s = now_s;
    if (s.last_token_s >= 0) stats_.token_gaps_s.push_back(now_s - s.last_token_s);
    s.last_token_s = now_s;
    const bool eos = std::find(cfg_.eos.begin(), cfg_.eos.end(), token) != cfg_.eos.end();
    s.ended = eos || int32_t(s.generated.size()) >= s.req.max_new_tokens;
    if (cfg_.on_token) cfg_.on_token(s.req.seq, token, false);
  }
  LFM2_CHECK(t == n, "scheduler: item ", item, " came back with ", n, " tokens, it emits ", t);
  const bool prompt = std::any_of(it->second.begin(), it->second.end(), [](const Entry& e) { return e.prompt; });
  ++(prompt ? stats_.prompt_items_back : stats_.decode_items_back);
  (prompt ? stats_.prompt_items_s : stats_.decode_items_s) += now_s - last_back_s_;
  last_back_s_ = now_s;
  std::vector<int64_t> ended;
  for (const Entry& e : it->second)
    if (seqs_.at(e.id).ended && seqs_.at(e.id).in_flight == 0) ended.push_back(e.id);
  flight_.erase(it);
  for (int64_t id : ended) {
    if (cfg_.on_token) cfg_.on_token(seqs_.at(id).req.seq, -1, true);
    retire(id, now_s);
  }
}

void BatchScheduler::retire(int64_t id, double now_s) {
  Seq& s = seqs_.at(id);
  FinishedSeq f;
  f.seq = s.req.seq;
  f.tokens = std::move(s.generated);
  f.n_tokens = int32_t(f.tokens.size());
  f.ended_at_eos = std::find(cfg_.eos.begin(), cfg_.eos.end(), f.tokens.back()) != cfg_.eos.end();
  f.added_s = s.added_s;
  f.first_token_s = s.first_token_s;
  f.finished_s = now_s;
  f.prompt_len = s.req.prompt_len;
  f.preemptions = s.preemptions;
  finished_.push_back(std::move(f));
  for (int32_t pg : s.pages) free_pages_.push_back(pg);
  free_slots_.push_back(s.slot);
  running_.erase(std::find(running_.begin(), running_.end(), id));
  seqs_.erase(id);
}

std::vector<FinishedSeq> BatchScheduler::take_finished() {
  std::vector<FinishedSeq> f;
  f.swap(finished_);
  return f;
}

}  // namespace lfm2
