#include "rank/engine/stage_program.h"

namespace lfm2 {

const char* op_name(StageOp op) {
  switch (op) {
    case StageOp::kSendPlan: return "send plan";
    case StageOp::kFreeBuffer: return "free buffer";
    case StageOp::kRecvFeedback: return "recv feedback";
    case StageOp::kRecv: return "recv";
    case StageOp::kPostAhead: return "post ahead";
    case StageOp::kInput: return "input";
    case StageOp::kLayers: return "layers";
    case StageOp::kFreeFeedbackSlot: return "free feedback slot";
    case StageOp::kOutput: return "output";
    case StageOp::kSendFeedback: return "send feedback";
    case StageOp::kSend: return "send";
    case StageOp::kReport: return "report";
    case StageOp::kRelease: return "release";
  }
  return "?";
}

std::vector<StageOp> item_program(const StepPlan& plan, bool first_stage, bool last_stage, bool travels) {
  std::vector<StageOp> p;
  if (travels && !last_stage) p.push_back(StageOp::kSendPlan);
  const bool alone = first_stage && last_stage;  // one stage: the output feeds the input in place
  if (first_stage && !alone) p.push_back(StageOp::kFreeBuffer);
  if (first_stage && !alone && plan.feedback_from >= 0) p.push_back(StageOp::kRecvFeedback);
  if (!first_stage) {
    p.push_back(StageOp::kRecv);
    p.push_back(StageOp::kPostAhead);
  }
  if (first_stage) p.push_back(StageOp::kInput);
  p.push_back(StageOp::kLayers);
  if (last_stage) {
    const bool feeds = !alone && plan.feeds_slot >= 0;
    if (feeds) p.push_back(StageOp::kFreeFeedbackSlot);
    p.push_back(StageOp::kOutput);
    if (feeds) p.push_back(StageOp::kSendFeedback);
    if (plan.reports) p.push_back(StageOp::kReport);
  } else {
    p.push_back(StageOp::kSend);
  }
  p.push_back(StageOp::kRelease);
  return p;
}

std::string program_text(const std::vector<StageOp>& program) {
  std::string s;
  for (StageOp op : program) s += (s.empty() ? "" : ", ") + std::string(op_name(op));
  return s;
}

}  // namespace lfm2
