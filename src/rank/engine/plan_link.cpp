#include "rank/engine/plan_link.h"

#include <climits>
#include <cstring>

#include "common/error.h"

namespace lfm2 {
namespace {

constexpr int kTag = 1;  // the link's one tag: plans go forward, tokens back, never on one pair of ranks

}  // namespace

PlanLink::PlanLink(const WorldConfig& pipe, double timeout_s) : pipe_(pipe), timeout_s_(timeout_s) {
  LFM2_CHECK(pipe_.size == 1 || pipe_.link != MPI_COMM_NULL, "plan link: the pipeline has no host link");
}

PlanLink::~PlanLink() {
  // A run that ended by an error may leave sends behind; MPI_Abort follows, nothing to wait for.
  for (Send& s : sends_)
    if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);
}

void PlanLink::post(std::vector<uint8_t> bytes, int peer) {
  LFM2_CHECK(bytes.size() <= size_t(INT_MAX), "plan link: a message of ", bytes.size(), " bytes");
  sends_.push_back({std::move(bytes), MPI_REQUEST_NULL});
  Send& s = sends_.back();
  MPI_CHECK(MPI_Isend(s.bytes.data(), int(s.bytes.size()), MPI_BYTE, peer, kTag, pipe_.link, &s.req),
            "sending to ", pipe_.rank_name(peer), " on the host link");
  release_sent();
}

void PlanLink::release_sent() {
  while (!sends_.empty()) {
    int done = 0;
    MPI_CHECK(MPI_Test(&sends_.front().req, &done, MPI_STATUS_IGNORE), "the host link's sends");
    if (!done) return;
    sends_.pop_front();
  }
}

void PlanLink::send_plan(const StepPlan& plan) { post(to_bytes(plan), pipe_.next()); }

void PlanLink::send_end() { post({}, pipe_.next()); }

void PlanLink::send_tokens(int64_t item, const int32_t* tokens, int64_t n) {
  std::vector<uint8_t> b(8 + size_t(n) * 4);
  std::memcpy(b.data(), &item, 8);
  if (n) std::memcpy(b.data() + 8, tokens, size_t(n) * 4);
  post(std::move(b), 0);
}

// The next message from `peer`, received whole; false when none has arrived and !wait.
bool PlanLink::probe(int peer, std::vector<uint8_t>* bytes, bool wait, const char* what) {
  MPI_Status st;
  int flag = 0;
  auto arrived = [&] {
    MPI_CHECK(MPI_Iprobe(peer, kTag, pipe_.link, &flag, &st), "probing the host link");
    if (!flag) release_sent();
    return flag != 0;
  };
  if (!arrived()) {
    if (!wait) return false;
    if (!poll_until(arrived, timeout_s_))
      LFM2_TIMEOUT("timed out after ", timeout_s_, " s waiting for ", what, " from ", pipe_.rank_name(peer),
                " (did it stop? see --timeout)");
  }
  int n = 0;
  MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &n), "the host link's message size");
  bytes->resize(size_t(n));
  MPI_CHECK(MPI_Recv(bytes->data(), n, MPI_BYTE, peer, kTag, pipe_.link, MPI_STATUS_IGNORE), "receiving ", what,
            " from ", pipe_.rank_name(peer));
  return true;
}

PlanLink::Got PlanLink::recv_plan(StepPlan* plan, bool wait) {
  std::vector<uint8_t> b;
  if (!probe(pipe_.prev(), &b, wait, "the next item's plan")) return Got::kNone;
  if (b.empty()) return Got::kEnd;
  *plan = plan_from_bytes(b.data(), b.size());
  return Got::kPlan;
}

bool PlanLink::recv_tokens(int64_t* item, std::vector<int32_t>* tokens, bool wait) {
  std::vector<uint8_t> b;
  if (!probe(pipe_.size - 1, &b, wait, "the chosen tokens")) return false;
  LFM2_CHECK(b.size() >= 8 && (b.size() - 8) % 4 == 0, "plan link: a token message of ", b.size(), " bytes");
  std::memcpy(item, b.data(), 8);
  tokens->resize((b.size() - 8) / 4);
  if (!tokens->empty()) std::memcpy(tokens->data(), b.data() + 8, tokens->size() * 4);
  return true;
}

void PlanLink::flush() {
  if (!poll_until(
          [&] {
            release_sent();
            return sends_.empty();
          },
          timeout_s_))
    LFM2_SEND_TIMEOUT("timed out after ", timeout_s_, " s sending on the host link (did a stage stop? see --timeout)");
}

}  // namespace lfm2
