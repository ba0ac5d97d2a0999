#include "rank/engine/stage_steps.h"

#include "common/error.h"
#include "common/log.h"

namespace lfm2 {
namespace {

// A scored item as the executor takes it: sequences [first, first + n), each `width` rows.
struct Block {
  int64_t first = 0, n = 0, width = 0;
};

Block block_of(const StepPlan& plan) {
  LFM2_CHECK(!plan.seqs.empty(), "step plan: ", plan.name(), " carries no sequence");
  const SeqRows& s0 = plan.seqs[0];
  Block b{s0.seq, plan.n_seqs(), s0.n_rows};
  for (int64_t k = 0; k < b.n; ++k) {
    const SeqRows& s = plan.seqs[size_t(k)];
    LFM2_CHECK(s.seq == b.first + k && s.n_rows == b.width && s.first_pos == 0, "step plan: ", plan.name(),
               ": scoring takes one block of consecutive sequences of one width");
  }
  return b;
}

void head(const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem) {
  const Block b = block_of(plan);
  const int64_t V = mem.vocab;
  HeadOutputs out;
  out.next_token = mem.head.next_token + b.first;
  out.margin = mem.head.margin + b.first;
  out.logits = mem.head.logits ? mem.head.logits + b.first * V : nullptr;
  out.all_logits = mem.head.all_logits ? mem.head.all_logits + b.first * b.width * V : nullptr;
  exec.head(x, b.n, b.width, mem.lengths ? mem.lengths + b.first : nullptr, out);
}

// Static schedules: the prompt entries' ids, laid out item after item when the job started.
const int32_t* packed_rows(const StepPlan& plan, const StepMemory& mem) {
  if (plan.rows() == plan.n_decode()) return nullptr;
  LFM2_CHECK(plan.ids_offset >= 0, "step plan: ", plan.name(), ": its prompt rows have no ids");
  return mem.packed_ids + plan.ids_offset;
}

// Look-ahead (plan.fed_chosen): the decode entries' tokens, some chosen by the item before (still in
// spare_tokens, in stream order) and some from the host's staging, gathered into fed_tokens in runs
// (one copy each); when they are that item's tokens in order, its buffer itself.
const int32_t* gather_fed(const StepPlan& plan, const int32_t* staged, StageExecutor& exec, const StepMemory& mem) {
  if (plan.fed_chosen.empty()) return staged;
  const int64_t n = plan.n_decode();
  LFM2_CHECK(int64_t(plan.fed_chosen.size()) == n && mem.spare_tokens && mem.fed_tokens, "step plan: ",
             plan.name(), ": ", plan.fed_chosen.size(), " tokens fed on the device for ", n, " decode entries");
  const std::vector<int32_t>& c = plan.fed_chosen;
  int64_t k = 0;
  while (k < n && c[size_t(k)] == int32_t(k)) ++k;
  if (k == n) return mem.spare_tokens;
  for (k = 0; k < n;) {
    int64_t e = k + 1;
    if (c[size_t(k)] < 0) {
      while (e < n && c[size_t(e)] < 0) ++e;
      exec.copy_tokens(mem.fed_tokens + k, staged + k, e - k);
    } else {
      while (e < n && c[size_t(e)] == c[size_t(e - 1)] + 1) ++e;
      exec.copy_tokens(mem.fed_tokens + k, mem.spare_tokens + c[size_t(k)], e - k);
    }
    k = e;
  }
  return mem.fed_tokens;
}

void embed(const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem) {
  if (!plan.generation()) {
    const Block b = block_of(plan);
    return exec.embed(mem.ids + b.first * mem.width, b.n, b.width, x);
  }
  const StepBatch b = batch_of(plan, mem.seq_base);
  if (plan.feedback_slot >= 0 || (plan.n_decode() == 0 && mem.packed_ids)) {
    const int32_t* fed = plan.feedback_slot >= 0 ? feedback_tokens(mem, plan.feedback_slot) : nullptr;
    return exec.embed_batch(b, packed_rows(plan, mem), fed, x);
  }
  LFM2_CHECK(mem.staging, "step plan: ", plan.name(), ": no staging for its host inputs");
  LFM2_CHECK(int64_t(plan.fed.size()) == plan.n_decode(), "step plan: ", plan.name(), ": ", plan.fed.size(),
             " fed tokens for ", plan.n_decode(), " decode entries");
  const StagedInput in = mem.staging->stage(plan);
  exec.embed_batch(b, in.prompt_ids, gather_fed(plan, in.fed, exec, mem), x);
}

// The plan's page grants, a run of consecutive entries of one slot per call.
void map_grants(const StepPlan& plan, StageExecutor& exec) {
  std::vector<int32_t> pages;
  for (size_t i = 0; i < plan.grants.size();) {
    const PageGrant& g = plan.grants[i];
    pages.clear();
    size_t j = i;
    while (j < plan.grants.size() && plan.grants[j].slot == g.slot &&
           plan.grants[j].index == g.index + int32_t(j - i))
      pages.push_back(plan.grants[j++].page);
    exec.map_pages(g.slot, g.index, pages.data(), int64_t(pages.size()));
    i = j;
  }
}

void layers(const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem) {
  if (!plan.generation()) {
    const Block b = block_of(plan);
    return exec.forward(x, b.n, b.width);
  }
  map_grants(plan, exec);
  exec.forward_batch(x, batch_of(plan, mem.seq_base));
}

void choose(const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem) {
  int32_t* tokens = plan.feeds_slot >= 0 ? feedback_tokens(mem, plan.feeds_slot) : mem.spare_tokens;
  int32_t* host = plan.emit_offset >= 0 ? mem.host_emits + plan.emit_offset : report_tokens(mem, plan.item);
  LFM2_CHECK(plan.sampling.empty() || int64_t(plan.sampling.size()) == plan.n_emit(), "step plan: ", plan.name(),
             ": ", plan.sampling.size(), " samplings for ", plan.n_emit(), " emitting entries");
  exec.choose_batch(x, batch_of(plan, mem.seq_base), plan.sampling.empty() ? nullptr : plan.sampling.data(), tokens,
                    host);
  if (mem.stream_tokens <= 0 || !host) return;
  exec.synchronize();  // the item's tokens on the host
  int64_t e = 0;
  for (const SeqRows& s : plan.seqs) {
    if (s.gen_step < 0) continue;
    log_event(cat("{\"seq\": ", s.seq + mem.seq_base, ", \"token\": ", host[e], "}"));
    ++e;
  }
}

}  // namespace

StepBatch batch_of(const StepPlan& plan, int64_t seq_base) {
  StepBatch b;
  b.seqs.reserve(plan.seqs.size());
  for (const SeqRows& s : plan.seqs)
    b.seqs.push_back({s.seq + seq_base, s.slot, s.first_pos, s.n_rows, s.gen_step, s.decode});
  return b;
}

size_t item_bytes(const StepPlan& plan, int64_t hidden, DType act_dtype) {
  if (plan.generation()) return size_t(plan.rows() * hidden + plan.n_decode()) * sizeof(float);
  return size_t(plan.rows() * hidden) * dtype_size(act_dtype);
}

int64_t item_tokens(const StepPlan& plan, int64_t hidden) {
  return plan.rows() + (plan.n_decode() + hidden - 1) / hidden;
}

const char* step_name(StageOp op, StepPlan::Kind kind) {
  const bool scoring = kind == StepPlan::Kind::kScore;
  switch (op) {
    case StageOp::kInput: return "embed";
    case StageOp::kLayers: return scoring ? "forward" : "layers";
    case StageOp::kOutput: return scoring ? "head" : "choose";
    default: return op_name(op);
  }
}

void run_step(StageOp op, const StepPlan& plan, void* x, StageExecutor& exec, const StepMemory& mem) {
  switch (op) {
    case StageOp::kInput: return embed(plan, x, exec, mem);
    case StageOp::kLayers: return layers(plan, x, exec, mem);
    case StageOp::kOutput:
      if (!plan.generation()) return head(plan, x, exec, mem);
      return choose(plan, x, exec, mem);
    default: LFM2_FAIL("run_step: ", op_name(op), " is no compute step");
  }
}

int32_t* report_tokens(const StepMemory& mem, int64_t item) {
  return mem.report_tokens.empty() ? nullptr : mem.report_tokens[size_t(item % int64_t(mem.report_tokens.size()))];
}

int32_t* feedback_tokens(const StepMemory& mem, int slot) {
  LFM2_CHECK(slot >= 0 && size_t(slot) < mem.token_slots.size(), "step plan: feedback slot ", slot, " of ",
             mem.token_slots.size());
  return mem.token_slots[size_t(slot)];
}

size_t feedback_bytes(const StepPlan& plan) { return size_t(plan.n_emit()) * sizeof(int32_t); }

}  // namespace lfm2
