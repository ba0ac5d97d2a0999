#include "rank/engine/step_plan.h"

#include "common/byte_codec.h"
#include "common/error.h"

namespace lfm2 {
namespace {

constexpr uint32_t kMagic = 0x32504c53;  // "SLP2": the format of to_bytes
constexpr size_t kHeaderBytes = 76, kSeqBytes = 32, kGrantBytes = 12, kFedBytes = 4, kSamplingBytes = 20;

}  // namespace

bool SeqRows::operator==(const SeqRows& o) const {
  return seq == o.seq && slot == o.slot && first_pos == o.first_pos && n_rows == o.n_rows &&
         n_tokens == o.n_tokens && gen_step == o.gen_step && decode == o.decode;
}

bool StepPlan::operator==(const StepPlan& o) const {
  auto same_sampling = [](const SeqSampling& a, const SeqSampling& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.seed == b.seed;
  };
  if (sampling.size() != o.sampling.size()) return false;
  for (size_t i = 0; i < sampling.size(); ++i)
    if (!same_sampling(sampling[i], o.sampling[i])) return false;
  return item == o.item && kind == o.kind && micro == o.micro && seqs == o.seqs && grants == o.grants &&
         feedback_from == o.feedback_from && feedback_slot == o.feedback_slot && feeds_slot == o.feeds_slot &&
         fed == o.fed && fed_chosen == o.fed_chosen && emit_offset == o.emit_offset && ids_offset == o.ids_offset && reports == o.reports;
}

StepPlan::Kind generation_kind(const std::vector<SeqRows>& seqs) {
  bool decode = false, prompt = false;
  for (const SeqRows& s : seqs) (s.decode ? decode : prompt) = true;
  return decode && prompt ? StepPlan::Kind::kMixed : decode ? StepPlan::Kind::kDecode : StepPlan::Kind::kPrefill;
}

std::string StepPlan::name() const {
  if (micro < 0) return cat("item ", item);
  switch (kind) {
    case Kind::kScore: return cat("microbatch ", micro);
    case Kind::kPrefill: return cat("the prefill of microbatch ", micro);
    case Kind::kDecode: return cat("step ", seqs.empty() ? 0 : seqs[0].gen_step, " of microbatch ", micro);
    case Kind::kMixed: return cat("item ", item, " (microbatch ", micro, ")");
  }
  return cat("item ", item);
}

std::vector<uint8_t> to_bytes(const StepPlan& plan) {
  LFM2_CHECK(plan.fed_chosen.empty(), "step plan: ", plan.name(), ": tokens fed on the device never travel");
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + kSeqBytes * plan.seqs.size() + kGrantBytes * plan.grants.size() +
              kFedBytes * plan.fed.size() + kSamplingBytes * plan.sampling.size());
  put_le<uint32_t>(out, kMagic);
  put_le<int64_t>(out, plan.item);
  put_le<int32_t>(out, int32_t(plan.kind));
  put_le<int64_t>(out, plan.micro);
  put_le<int64_t>(out, plan.feedback_from);
  put_le<int32_t>(out, plan.feedback_slot);
  put_le<int32_t>(out, plan.feeds_slot);
  put_le<int64_t>(out, plan.emit_offset);
  put_le<int64_t>(out, plan.ids_offset);
  put_le<int32_t>(out, plan.reports ? 1 : 0);
  put_le<uint32_t>(out, uint32_t(plan.seqs.size()));
  put_le<uint32_t>(out, uint32_t(plan.grants.size()));
  put_le<uint32_t>(out, uint32_t(plan.fed.size()));
  put_le<uint32_t>(out, uint32_t(plan.sampling.size()));
  for (const SeqRows& s : plan.seqs) {
    put_le<int64_t>(out, s.seq);
    put_le<int32_t>(out, s.slot);
    put_le<int32_t>(out, s.first_pos);
    put_le<int32_t>(out, s.n_rows);
    put_le<int32_t>(out, s.n_tokens);
    put_le<int32_t>(out, s.gen_step);
    put_le<int32_t>(out, s.decode ? 1 : 0);
  }
  for (const PageGrant& g : plan.grants) {
    put_le<int32_t>(out, g.slot);
    put_le<int32_t>(out, g.index);
    put_le<int32_t>(out, g.page);
  }
  for (int32_t t : plan.fed) put_le<int32_t>(out, t);
  for (const SeqSampling& s : plan.sampling) {
    put_le<float>(out, s.temperature);
    put_le<int32_t>(out, s.top_k);
    put_le<float>(out, s.top_p);
    put_le<uint64_t>(out, s.seed);
  }
  return out;
}

StepPlan plan_from_bytes(const uint8_t* bytes, size_t n) {
  LFM2_CHECK(bytes && n >= kHeaderBytes, "step plan: ", n, " bytes, a plan has at least ", kHeaderBytes);
  const uint8_t* p = bytes;
  LFM2_CHECK(take_le<uint32_t>(p) == kMagic, "step plan: not a plan (bad magic)");
  StepPlan plan;
  plan.item = take_le<int64_t>(p);
  const int32_t kind = take_le<int32_t>(p);
  LFM2_CHECK(kind >= 0 && kind <= int32_t(StepPlan::Kind::kMixed), "step plan: unknown kind ", kind);
  plan.kind = StepPlan::Kind(kind);
  plan.micro = take_le<int64_t>(p);
  plan.feedback_from = take_le<int64_t>(p);
  plan.feedback_slot = take_le<int32_t>(p);
  plan.feeds_slot = take_le<int32_t>(p);
  plan.emit_offset = take_le<int64_t>(p);
  plan.ids_offset = take_le<int64_t>(p);
  plan.reports = take_le<int32_t>(p) != 0;
  const size_t n_seqs = take_le<uint32_t>(p), n_grants = take_le<uint32_t>(p), n_fed = take_le<uint32_t>(p),
               n_sampling = take_le<uint32_t>(p);
  const size_t want = kHeaderBytes + kSeqBytes * n_seqs + kGrantBytes * n_grants + kFedBytes * n_fed +
                      kSamplingBytes * n_sampling;
  LFM2_CHECK(n == want, "step plan: ", n, " bytes for ", n_seqs, " sequences, ", n_grants, " pages, ", n_fed,
             " fed tokens and ", n_sampling, " samplings (", want, " bytes)");
  plan.seqs.resize(n_seqs);
  for (SeqRows& s : plan.seqs) {
    s.seq = take_le<int64_t>(p);
    s.slot = take_le<int32_t>(p);
    s.first_pos = take_le<int32_t>(p);
    s.n_rows = take_le<int32_t>(p);
    s.n_tokens = take_le<int32_t>(p);
    s.gen_step = take_le<int32_t>(p);
    s.decode = take_le<int32_t>(p) != 0;
  }
  plan.grants.resize(n_grants);
  for (PageGrant& g : plan.grants) {
    g.slot = take_le<int32_t>(p);
    g.index = take_le<int32_t>(p);
    g.page = take_le<int32_t>(p);
  }
  plan.fed.resize(n_fed);
  for (int32_t& t : plan.fed) t = take_le<int32_t>(p);
  plan.sampling.resize(n_sampling);
  for (SeqSampling& s : plan.sampling) {
    s.temperature = take_le<float>(p);
    s.top_k = take_le<int32_t>(p);
    s.top_p = take_le<float>(p);
    s.seed = take_le<uint64_t>(p);
  }
  return plan;
}

}  // namespace lfm2
