#include "rank/jobs/schedulers.h"

#include <algorithm>

#include "common/error.h"
#include "model/step_layout.h"
#include "plan/microbatch.h"

namespace lfm2 {
namespace {

int32_t length_of(const std::vector<int32_t>& lengths, int64_t s, int64_t width) {
  return lengths.empty() ? int32_t(width) : lengths[size_t(s)];
}

void check_shape(int64_t n_seq, int64_t width, int64_t microbatch, const std::vector<int32_t>& lengths) {
  LFM2_CHECK(n_seq > 0 && width > 0 && microbatch > 0, "schedule: empty batch");
  LFM2_CHECK(lengths.empty() || int64_t(lengths.size()) == n_seq, "schedule: ", lengths.size(), " lengths for ",
             n_seq, " sequences");
}

// Microbatch g's sequences [begin, end).
std::pair<int64_t, int64_t> micro_range(int64_t g, int64_t n_seq, int64_t microbatch) {
  return {g * microbatch, std::min(n_seq, (g + 1) * microbatch)};
}

// Slot s's pages, all granted by its microbatch's first prefill item.
void grant_all(StepPlan& p, int64_t s, const StateShape& state) {
  for (int64_t k = 0; k < state.max_pages; ++k)
    p.grants.push_back({int32_t(s), int32_t(k), int32_t(s * state.max_pages + k)});
}

// Microbatch g's prefill. Whole prompts (chunk 0): one item. In chunks: every prompt's rows but its
// last, one after the other, cut into items of at most `chunk` rows (an entry per piece of a
// prompt), then one item of each prompt's last row: every first token of the microbatch comes from
// that item, as the decode steps' feedback needs.
std::vector<StepPlan> prefill_items(int64_t g, int64_t n_seq, int64_t width, int64_t microbatch,
                                    const std::vector<int32_t>& lengths, const StateShape& state, int64_t chunk) {
  const auto [b, e] = micro_range(g, n_seq, microbatch);
  std::vector<StepPlan> items(1);
  items[0].kind = StepPlan::Kind::kPrefill;
  for (int64_t s = b; s < e; ++s) grant_all(items[0], s, state);
  if (chunk <= 0) {
    for (int64_t s = b; s < e; ++s) {
      const int32_t n = length_of(lengths, s, width);
      items[0].seqs.push_back({s, int32_t(s), 0, n, n, 0, false});
    }
    return items;
  }
  int64_t room = chunk;
  for (int64_t s = b; s < e; ++s)
    for (int32_t pos = 0, body = length_of(lengths, s, width) - 1; pos < body;) {
      if (room == 0) {
        items.emplace_back().kind = StepPlan::Kind::kPrefill;
        room = chunk;
      }
      const int32_t n = int32_t(std::min<int64_t>(room, body - pos));
      items.back().seqs.push_back({s, int32_t(s), pos, n, n, -1, false});
      pos += n;
      room -= n;
    }
  StepPlan last;
  last.kind = StepPlan::Kind::kPrefill;
  for (int64_t s = b; s < e; ++s) last.seqs.push_back({s, int32_t(s), length_of(lengths, s, width) - 1, 1, 1, 0, false});
  if (items.back().seqs.empty()) {
    last.grants = std::move(items.back().grants);
    items.back() = std::move(last);
  } else {
    items.push_back(std::move(last));
  }
  return items;
}

StepPlan decode_item(int64_t g, int64_t t, int64_t n_seq, int64_t width, int64_t microbatch,
                     const std::vector<int32_t>& lengths) {
  StepPlan p;
  p.kind = StepPlan::Kind::kDecode;
  const auto [b, e] = micro_range(g, n_seq, microbatch);
  for (int64_t s = b; s < e; ++s)
    p.seqs.push_back({s, int32_t(s), int32_t(length_of(lengths, s, width) + t - 1), 1, 1, int32_t(t), true});
  return p;
}

}  // namespace

std::vector<StepPlan> score_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                     const std::vector<int32_t>& lengths) {
  check_shape(n_seq, width, microbatch, lengths);
  std::vector<StepPlan> plans;
  for (int64_t m = 0; m < n_microbatches(n_seq, microbatch); ++m) {
    StepPlan p;
    p.item = m;
    p.kind = StepPlan::Kind::kScore;
    p.micro = m;
    const auto [b, e] = micro_range(m, n_seq, microbatch);
    for (int64_t s = b; s < e; ++s) p.seqs.push_back({s, int32_t(s), 0, int32_t(width), length_of(lengths, s, width)});
    plans.push_back(std::move(p));
  }
  return plans;
}

std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps,
                                          const StateShape& state, int64_t prefill_chunk) {
  check_shape(n_seq, width, microbatch, lengths);
  LFM2_CHECK(steps >= 1, "schedule: ", steps, " generation steps");
  LFM2_CHECK(state.n_slots >= n_seq && state.max_positions() >= width + steps - 1 &&
                 state.n_pages >= n_seq * state.max_pages,
             "schedule: a state of ", state.n_slots, " slots of ", state.max_positions(), " positions for ", n_seq,
             " sequences of ", width + steps - 1);
  const int64_t G = n_microbatches(n_seq, microbatch);
  std::vector<StepPlan> plans;
  std::vector<int64_t> last_of(size_t(G), -1);  // per microbatch: its latest item, which feeds the next
  int64_t emitted = 0, ids = 0;
  auto add = [&](StepPlan p, int64_t g, int64_t t) {
    p.item = int64_t(plans.size());
    p.micro = g;
    const bool emits = p.n_emit() > 0;
    p.feeds_slot = emits && t + 1 < steps ? int32_t(g) : -1;
    if (t > 0) {
      p.feedback_from = last_of[size_t(g)];
      p.feedback_slot = int32_t(g);
    }
    if (p.rows() > p.n_decode()) {
      p.ids_offset = ids;
      ids += p.rows() - p.n_decode();
    }
    p.emit_offset = emits ? emitted : -1;
    emitted += p.n_emit();
    if (emits) last_of[size_t(g)] = p.item;
    plans.push_back(std::move(p));
  };
  for (int64_t g = 0; g < G; ++g)
    for (StepPlan& p : prefill_items(g, n_seq, width, microbatch, lengths, state, prefill_chunk)) add(std::move(p), g, 0);
  for (int64_t t = 1; t < steps; ++t)
    for (int64_t g = 0; g < G; ++g) add(decode_item(g, t, n_seq, width, microbatch, lengths), g, t);
  return plans;
}

std::vector<StepPlan> generation_schedule(int64_t n_seq, int64_t width, int64_t microbatch,
                                          const std::vector<int32_t>& lengths, int64_t steps) {
  return generation_schedule(n_seq, width, microbatch, lengths, steps, old_state_shape(n_seq, width + steps - 1), 0);
}

}  // namespace lfm2
