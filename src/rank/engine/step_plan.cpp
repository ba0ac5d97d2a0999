#include "rank/engine/step_plan.h"

#include "common/error.h"

namespace lfm2 {
namespace {

constexpr uint32_t kMagic = 0x31504c53;  // "SLP1": the format of to_bytes
constexpr size_t kHeaderBytes = 44, kSeqBytes = 32;

// Fixed-width integers, least significant byte first, whatever the host's byte order.
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const uint64_t u = uint64_t(v);
  for (size_t b = 0; b < sizeof(T); ++b) out.push_back(uint8_t(u >> (8 * b)));
}

template <typename T>
T take(const uint8_t*& p) {
  uint64_t u = 0;
  for (size_t b = 0; b < sizeof(T); ++b) u |= uint64_t(p[b]) << (8 * b);
  p += sizeof(T);
  return T(u);
}

}  // namespace

bool SeqRows::operator==(const SeqRows& o) const {
  return seq == o.seq && slot == o.slot && first_pos == o.first_pos && n_rows == o.n_rows &&
         n_tokens == o.n_tokens && gen_step == o.gen_step;
}

bool StepPlan::operator==(const StepPlan& o) const {
  return item == o.item && kind == o.kind && micro == o.micro && seqs == o.seqs &&
         feedback_from == o.feedback_from && feedback_slot == o.feedback_slot && feeds_slot == o.feeds_slot;
}

int64_t StepPlan::rows() const {
  int64_t n = 0;
  for (const SeqRows& s : seqs) n += s.n_rows;
  return n;
}

std::string StepPlan::name() const {
  switch (kind) {
    case Kind::kScore: return cat("microbatch ", micro);
    case Kind::kPrefill: return cat("the prefill of microbatch ", micro);
    case Kind::kDecode: return cat("step ", seqs.empty() ? 0 : seqs[0].gen_step, " of microbatch ", micro);
  }
  return cat("item ", item);
}

std::vector<uint8_t> to_bytes(const StepPlan& plan) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + kSeqBytes * plan.seqs.size());
  put<uint32_t>(out, kMagic);
  put<int64_t>(out, plan.item);
  put<int32_t>(out, int32_t(plan.kind));
  put<int64_t>(out, plan.micro);
  put<int64_t>(out, plan.feedback_from);
  put<int32_t>(out, plan.feedback_slot);
  put<int32_t>(out, plan.feeds_slot);
  put<uint32_t>(out, uint32_t(plan.seqs.size()));
  for (const SeqRows& s : plan.seqs) {
    put<int64_t>(out, s.seq);
    put<int64_t>(out, s.slot);
    put<int32_t>(out, s.first_pos);
    put<int32_t>(out, s.n_rows);
    put<int32_t>(out, s.n_tokens);
    put<int32_t>(out, s.gen_step);
  }
  return out;
}

StepPlan plan_from_bytes(const uint8_t* bytes, size_t n) {
  LFM2_CHECK(bytes && n >= kHeaderBytes, "step plan: ", n, " bytes, a plan has at least ", kHeaderBytes);
  const uint8_t* p = bytes;
  LFM2_CHECK(take<uint32_t>(p) == kMagic, "step plan: not a plan (bad magic)");
  StepPlan plan;
  plan.item = take<int64_t>(p);
  const int32_t kind = take<int32_t>(p);
  LFM2_CHECK(kind >= 0 && kind <= int32_t(StepPlan::Kind::kDecode), "step plan: unknown kind ", kind);
  plan.kind = StepPlan::Kind(kind);
  plan.micro = take<int64_t>(p);
  plan.feedback_from = take<int64_t>(p);
  plan.feedback_slot = take<int32_t>(p);
  plan.feeds_slot = take<int32_t>(p);
  const size_t n_seqs = take<uint32_t>(p);
  LFM2_CHECK(n == kHeaderBytes + kSeqBytes * n_seqs, "step plan: ", n, " bytes for ", n_seqs, " sequences");
  plan.seqs.resize(n_seqs);
  for (SeqRows& s : plan.seqs) {
    s.seq = take<int64_t>(p);
    s.slot = take<int64_t>(p);
    s.first_pos = take<int32_t>(p);
    s.n_rows = take<int32_t>(p);
    s.n_tokens = take<int32_t>(p);
    s.gen_step = take<int32_t>(p);
  }
  return plan;
}

}  // namespace lfm2
