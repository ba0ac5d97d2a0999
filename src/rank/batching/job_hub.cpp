#include "rank/batching/job_hub.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "common/byte_codec.h"
#include "common/clock.h"
#include "common/error.h"

namespace lfm2 {
namespace {

// On MPI_COMM_WORLD; run_report.cpp uses 32765 and 32767, result_gather.cpp 32766. Results and
// the done message share a tag, so that done never overtakes a replica's last results.
constexpr int kRequestTag = 32750, kGrantTag = 32751, kResultsTag = 32752;
constexpr uint8_t kResults = 0, kDone = 1;
constexpr int64_t kBatch = 64;       // results a client sends at once
constexpr double kSendEveryS = 0.5;  // or this often

template <typename T>
T get(const uint8_t*& p, const uint8_t* end) {
  LFM2_CHECK(p + sizeof(T) <= end, "job hub: a truncated results message");
  return take_le<T>(p);
}

// A whole message from `peer` with `tag`, if one has arrived.
bool try_recv(const WorldConfig& world, int peer, int tag, std::vector<uint8_t>* bytes) {
  int flag = 0;
  MPI_Status st;
  MPI_CHECK(MPI_Iprobe(peer, tag, world.comm, &flag, &st), "the job hub");
  if (!flag) return false;
  int n = 0;
  MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &n), "the job hub");
  bytes->resize(size_t(n));
  MPI_CHECK(MPI_Recv(bytes->data(), n, MPI_BYTE, peer, tag, world.comm, MPI_STATUS_IGNORE), "the job hub");
  return true;
}

}  // namespace

void put_finished(std::vector<uint8_t>& out, const FinishedSeq& f) {
  put_le<int64_t>(out, f.seq);
  put_le<int32_t>(out, int32_t(f.tokens.size()));
  put_le<uint8_t>(out, f.ended_at_eos ? 1 : 0);
  put_le<int32_t>(out, f.prompt_len);
  put_le<int32_t>(out, f.preemptions);
  for (int32_t t : f.tokens) put_le<int32_t>(out, t);
  put_le<double>(out, f.added_s);
  put_le<double>(out, f.first_token_s);
  put_le<double>(out, f.finished_s);
}

std::vector<FinishedSeq> take_finished(const uint8_t* p, size_t n) {
  const uint8_t* end = p + n;
  std::vector<FinishedSeq> v;
  while (p < end) {
    FinishedSeq f;
    f.seq = get<int64_t>(p, end);
    const int32_t count = get<int32_t>(p, end);
    f.ended_at_eos = get<uint8_t>(p, end) != 0;
    f.prompt_len = get<int32_t>(p, end);
    f.preemptions = get<int32_t>(p, end);
    LFM2_CHECK(count >= 0, "job hub: a record of ", count, " tokens");
    for (int32_t k = 0; k < count; ++k) f.tokens.push_back(get<int32_t>(p, end));
    f.added_s = get<double>(p, end);
    f.first_token_s = get<double>(p, end);
    f.finished_s = get<double>(p, end);
    f.n_tokens = count;
    v.push_back(std::move(f));
  }
  return v;
}

HubServer::HubServer(const WorldConfig& world, const ReplicaLayout& layout, std::vector<int64_t> pending, Sink sink,
                     double timeout_s)
    : world_(world), layout_(layout), pending_(pending.begin(), pending.end()), sink_(std::move(sink)),
      timeout_s_(timeout_s), done_(size_t(layout.n_replicas), false), grants_(size_t(world.size)),
      grant_reqs_(size_t(world.size), MPI_REQUEST_NULL) {}

std::vector<int64_t> HubServer::take(int64_t n) {
  std::vector<int64_t> v;
  while (int64_t(v.size()) < n && !pending_.empty()) {
    v.push_back(pending_.front());
    pending_.pop_front();
  }
  return v;
}

void HubServer::answer(int rank) {
  std::vector<uint8_t> b;
  if (!try_recv(world_, rank, kRequestTag, &b)) return;
  LFM2_CHECK(b.size() == 8, "job hub: a request of ", b.size(), " bytes from ", world_.rank_name(rank));
  int64_t want = 0;
  std::memcpy(&want, b.data(), 8);
  if (grant_reqs_[size_t(rank)] != MPI_REQUEST_NULL)
    MPI_CHECK(MPI_Wait(&grant_reqs_[size_t(rank)], MPI_STATUS_IGNORE), "the job hub");  // one at a time: done
  grants_[size_t(rank)] = take(want);
  const std::vector<int64_t>& g = grants_[size_t(rank)];
  MPI_CHECK(MPI_Isend(g.data(), int(g.size()), MPI_INT64_T, rank, kGrantTag, world_.comm, &grant_reqs_[size_t(rank)]),
            "granting sequences to ", world_.rank_name(rank));
}

void HubServer::receive_results(int rank) {
  std::vector<uint8_t> b;
  while (try_recv(world_, rank, kResultsTag, &b)) {
    LFM2_CHECK(!b.empty(), "job hub: an empty results message from ", world_.rank_name(rank));
    const int replica = layout_.replica_of[size_t(rank)];
    for (FinishedSeq& f : take_finished(b.data() + 1, b.size() - 1)) sink_(std::move(f), replica);
    if (b[0] == kDone) done_[size_t(replica)] = true;
    ++heard_;
  }
}

void HubServer::serve() {
  for (int r = 1; r < layout_.n_replicas; ++r) {
    const int rank = layout_.ranks[size_t(r)].front();
    answer(rank);
    receive_results(rank);
  }
}

void HubServer::replica_done() {
  done_[0] = true;
  auto waiting_for = [&] {
    std::vector<int> ranks;
    for (int r = 0; r < layout_.n_replicas; ++r)
      if (!done_[size_t(r)]) ranks.push_back(layout_.ranks[size_t(r)].front());
    return ranks;
  };
  // As long as the other replicas work; --timeout bounds a silence only.
  double heard_at = now_s();
  int64_t heard = heard_;
  while (!waiting_for().empty()) {
    serve();
    if (heard_ != heard) {
      heard = heard_;
      heard_at = now_s();
    } else if (now_s() - heard_at > timeout_s_) {
      LFM2_TIMEOUT("timed out after ", timeout_s_, " s without a word from ", name_ranks(world_, waiting_for()),
                   " (a replica's first stage; did it stop? see --timeout; --resume redoes its unfinished sequences)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (MPI_Request& r : grant_reqs_)
    if (r != MPI_REQUEST_NULL) MPI_CHECK(MPI_Wait(&r, MPI_STATUS_IGNORE), "the job hub");
}

HubClient::HubClient(const WorldConfig& world, double timeout_s) : world_(world), timeout_s_(timeout_s) {}

HubClient::~HubClient() {
  for (auto& s : sends_)
    if (s.second != MPI_REQUEST_NULL) MPI_Request_free(&s.second);
}

std::vector<int64_t> HubClient::take(int64_t n) {
  serve();
  if (granted_.empty() && !asked_ && !queue_done_) {
    const int64_t want = std::max<int64_t>(n, 1);
    MPI_CHECK(MPI_Send(&want, 1, MPI_INT64_T, 0, kRequestTag, world_.comm), "asking rank 0 for sequences");
    asked_ = true;
    serve();
  }
  const size_t k = std::min(granted_.size(), size_t(std::max<int64_t>(n, 0)));
  std::vector<int64_t> v(granted_.begin(), granted_.begin() + int64_t(k));
  granted_.erase(granted_.begin(), granted_.begin() + int64_t(k));
  return v;
}

void HubClient::serve() {
  if (asked_) {
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(0, kGrantTag, world_.comm, &flag, &st), "the job hub");
    if (flag) {
      int n = 0;
      MPI_CHECK(MPI_Get_count(&st, MPI_INT64_T, &n), "the job hub");
      std::vector<int64_t> g(static_cast<size_t>(n));
      MPI_CHECK(MPI_Recv(g.data(), n, MPI_INT64_T, 0, kGrantTag, world_.comm, MPI_STATUS_IGNORE), "the job hub");
      asked_ = false;
      if (g.empty()) queue_done_ = true;
      granted_.insert(granted_.end(), g.begin(), g.end());
    }
  }
  if (n_results_ > 0 && now_s() - last_send_s_ >= kSendEveryS) send_results(kResults);
  while (!sends_.empty()) {
    int done = 0;
    MPI_CHECK(MPI_Test(&sends_.front().second, &done, MPI_STATUS_IGNORE), "the job hub");
    if (!done) break;
    sends_.pop_front();
  }
}

void HubClient::finished(FinishedSeq&& f) {
  put_finished(results_, f);
  if (++n_results_ >= kBatch) send_results(kResults);
}

void HubClient::send_results(uint8_t kind) {
  std::vector<uint8_t> msg;
  msg.push_back(kind);
  msg.insert(msg.end(), results_.begin(), results_.end());
  results_.clear();
  n_results_ = 0;
  last_send_s_ = now_s();
  sends_.emplace_back(std::move(msg), MPI_REQUEST_NULL);
  auto& s = sends_.back();
  MPI_CHECK(MPI_Isend(s.first.data(), int(s.first.size()), MPI_BYTE, 0, kResultsTag, world_.comm, &s.second),
            "sending results to rank 0");
}

void HubClient::replica_done() {
  send_results(kDone);
  wait_sends();
}

void HubClient::wait_sends() {
  if (!poll_until(
          [&] {
            serve();
            return sends_.empty();
          },
          timeout_s_))
    LFM2_SEND_TIMEOUT("timed out after ", timeout_s_, " s sending results to rank 0, which writes the output (did it "
                      "stop? see --timeout)");
}

}  // namespace lfm2
