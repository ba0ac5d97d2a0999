#include "rank/engine/stage_steps.h"

#include "common/error.h"
#include "common/log.h"

namespace lfm2 {
namespace {

// An item as today's executors take it: sequences [first, first + n), each `width` rows.
struct Block {
  int64_t first = 0, n = 0, width = 0, step = 0;
};

Block block_of(const StepPlan& plan) {
  LFM2_CHECK(!plan.seqs.empty(), "step plan: ", plan.name(), " carries no sequence");
  const SeqRows& s0 = plan.seqs[0];
  Block b{s0.seq, plan.n_seqs(), s0.n_rows, s0.gen_step};
  for (int64_t k = 0; k < b.n; ++k) {
    const SeqRows& s = plan.seqs[size_t(k)];
    LFM2_CHECK(s.seq == b.first + k && s.slot == s.seq && s.n_rows == b.width && s.gen_step == b.step,
               "step plan: ", plan.name(), ": the executors take one block of consecutive sequences of one width");
  }
  return b;
}

void input(const StepPlan& plan, const Block& b, void* x, StageExecutor& exec, const StepMemory& mem) {
  if (plan.kind == StepPlan::Kind::kDecode)
    exec.embed_tokens(feedback_tokens(mem, plan.feedback_slot), b.n, x);
  else
    exec.embed(mem.ids + b.first * mem.width, b.n, b.width, x);
}

void layers(const StepPlan& plan, const Block& b, void* x, StageExecutor& exec) {
  switch (plan.kind) {
    case StepPlan::Kind::kScore: return exec.forward(x, b.n, b.width);
    case StepPlan::Kind::kPrefill: return exec.prefill(x, b.first, b.n, b.width);
    case StepPlan::Kind::kDecode: return exec.decode(x, b.first, b.n, b.step);
  }
}

void head(const Block& b, void* x, StageExecutor& exec, const StepMemory& mem) {
  const int64_t V = mem.vocab;
  HeadOutputs out;
  out.next_token = mem.head.next_token + b.first;
  out.margin = mem.head.margin + b.first;
  out.logits = mem.head.logits ? mem.head.logits + b.first * V : nullptr;
  out.all_logits = mem.head.all_logits ? mem.head.all_logits + b.first * b.width * V : nullptr;
  exec.head(x, b.n, b.width, mem.lengths ? mem.lengths + b.first : nullptr, out);
}

void choose(const StepPlan& plan, const Block& b, void* x, StageExecutor& exec, const StepMemory& mem) {
  int32_t* tokens = plan.feeds_slot >= 0 ? feedback_tokens(mem, plan.feeds_slot) : mem.spare_tokens;
  int32_t* host = mem.host_tokens + b.step * mem.n_seq + b.first;
  exec.choose(x, b.first, b.n, plan.kind == StepPlan::Kind::kPrefill ? b.width : 1, b.step, tokens, host);
  if (mem.stream_tokens > 0 && b.first == 0) {
    exec.synchronize();
    log_info(cat("stream: sequence 0, token ", b.step + 1, "/", mem.stream_tokens, ": ", host[0]));
  }
}

}  // namespace

size_t item_bytes(const StepPlan& plan, int64_t hidden, DType act_dtype) {
  if (plan.kind == StepPlan::Kind::kDecode) return size_t(decode_buffer_floats(plan.n_seqs(), hidden)) * sizeof(float);
  return size_t(plan.rows() * hidden) * dtype_size(act_dtype);
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
  const Block b = block_of(plan);
  switch (op) {
    case StageOp::kInput: return input(plan, b, x, exec, mem);
    case StageOp::kLayers: return layers(plan, b, x, exec);
    case StageOp::kOutput:
      if (plan.kind == StepPlan::Kind::kScore) return head(b, x, exec, mem);
      return choose(plan, b, x, exec, mem);
    default: LFM2_FAIL("run_step: ", op_name(op), " is no compute step");
  }
}

int32_t* feedback_tokens(const StepMemory& mem, int slot) {
  LFM2_CHECK(slot >= 0 && size_t(slot) < mem.token_slots.size(), "step plan: feedback slot ", slot, " of ",
             mem.token_slots.size());
  return mem.token_slots[size_t(slot)];
}

size_t feedback_bytes(const StepPlan& plan) { return size_t(plan.n_seqs()) * sizeof(int32_t); }

}  // namespace lfm2
