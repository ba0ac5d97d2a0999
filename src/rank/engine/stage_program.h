// A stage's program: what one stage does for one item of a schedule, in order, as plain
// instructions (DeepSpeed's InferenceSchedule idea). The engine's two interpreters
// (interpreter.h: host, device) run these and nothing else; what an instruction reads (which
// buffer, which feedback slot, how many bytes) follows from the item's plan and the stage's place.
//
//   first stage:  free buffer, recv feedback (generation's decode items), input, layers, send
//   other stages: recv, post ahead, layers, send
//   last stage:   ... layers, free feedback slot, output, send feedback (items that feed a later one)
// and every item ends with `release`. With one stage: input, layers, output, release. Where plans
// travel (continuous batching), every stage but the last begins an item with `send plan`, and the
// last stage reports a reporting item's tokens to the first stage's host after its output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rank/engine/step_plan.h"

namespace lfm2 {

enum class StageOp : uint8_t {
  kSendPlan,          // the item's plan to the next stage (plans that travel), before anything is queued
  kFreeBuffer,        // first stage: the last send out of the item's buffer must be done before it is rewritten
  kRecvFeedback,      // first stage: receive the tokens this item embeds from the last stage
  kRecv,              // the item's hidden states from the previous stage (receives posted up to it)
  kPostAhead,         // post the receives of the next items that can start now (overlap with compute)
  kInput,             // first stage: the item's input into its buffer (embed)
  kLayers,            // this stage's layers on the buffer
  kFreeFeedbackSlot,  // last stage: the slot's last feedback send must be done before it is rewritten
  kOutput,            // last stage: the head, or the choice of tokens
  kSendFeedback,      // last stage: the chosen tokens to the first stage
  kSend,              // the buffer to the next stage
  kReport,            // last stage: the item's chosen tokens, once on this host, to the first stage's scheduler
  kRelease,           // release the transfers that completed (a test, never a wait)
};

// "recv feedback", "layers", ...
const char* op_name(StageOp op);

// The instructions of one item on a stage that is the pipeline's first and/or last.
// travels: the plans travel with the hidden states (plan_feed.h).
std::vector<StageOp> item_program(const StepPlan& plan, bool first_stage, bool last_stage, bool travels = false);

// "recv, post ahead, layers, send, release": a program as text (tests, debugging).
std::string program_text(const std::vector<StageOp>& program);

}  // namespace lfm2
