#include "rank/report/result_gather.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "rank/mpi/world.h"

namespace lfm2 {
namespace {

constexpr int kResultsTag = 32766;          // run_report.cpp uses 32765 and 32767
constexpr size_t kChunk = size_t(1) << 30;  // bytes per message, below MPI's int count

// Starts sending or receiving `bytes` bytes of buf in chunks, appending the requests. Messages of
// one pair of ranks with one tag arrive in the order posted, so both sides post fields in order.
void post(std::vector<MPI_Request>* reqs, bool send, char* buf, size_t bytes, int peer, MPI_Comm comm) {
  for (size_t at = 0; at < bytes; at += kChunk) {
    const int n = int(std::min(kChunk, bytes - at));
    reqs->push_back(MPI_REQUEST_NULL);
    if (send)
      MPI_CHECK(MPI_Isend(buf + at, n, MPI_BYTE, peer, kResultsTag, comm, &reqs->back()), "sending results to rank ",
                peer);
    else
      MPI_CHECK(MPI_Irecv(buf + at, n, MPI_BYTE, peer, kResultsTag, comm, &reqs->back()),
                "receiving results from rank ", peer);
  }
}

bool all_done(std::vector<MPI_Request>& reqs) {
  int flag = 0;
  MPI_CHECK(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "moving the results");
  return flag != 0;
}

}  // namespace

ResultGather::ResultGather(const WorldConfig& world, const ReplicaLayout& layout, std::vector<SeqBlock> blocks)
    : world_(world), layout_(layout), blocks_(std::move(blocks)) {}

void ResultGather::add_bytes(const void* mine, size_t mine_bytes, size_t row_bytes, void* all) {
  fields_.push_back({mine, mine_bytes, row_bytes, all});
}

void ResultGather::run(double timeout_s) {
  const int me = world_.rank, writer = world_.size - 1, replica = layout_.replica_of[size_t(me)];
  if (layout_.last_rank(replica) != me) return;
  for (const Field& f : fields_)
    LFM2_CHECK(f.mine_bytes == size_t(blocks_[size_t(replica)].size()) * f.row_bytes, "results: ", f.mine_bytes,
               " bytes for the ", blocks_[size_t(replica)].size(), " sequences of replica ", replica);
  if (me != writer) {
    std::vector<MPI_Request> reqs;
    for (const Field& f : fields_)
      post(&reqs, true, const_cast<char*>(static_cast<const char*>(f.mine)), f.mine_bytes, writer, world_.comm);
    if (!poll_until([&] { return all_done(reqs); }, timeout_s))
      LFM2_SEND_TIMEOUT("timed out after ", timeout_s, " s sending the results of replica ", replica, " to ",
                        world_.rank_name(writer), ", which writes the output (did it stop? see --timeout)");
    return;
  }
  std::vector<std::vector<MPI_Request>> reqs(size_t(layout_.n_replicas));
  for (int r = 0; r < layout_.n_replicas; ++r)
    for (const Field& f : fields_) {
      char* dst = static_cast<char*>(f.all) + size_t(blocks_[size_t(r)].begin) * f.row_bytes;
      if (r == replica)
        std::memcpy(dst, f.mine, f.mine_bytes);
      else
        post(&reqs[size_t(r)], false, dst, size_t(blocks_[size_t(r)].size()) * f.row_bytes, layout_.last_rank(r),
             world_.comm);
    }
  std::vector<bool> done(size_t(layout_.n_replicas), false);
  auto every = [&] {
    bool ok = true;
    for (int r = 0; r < layout_.n_replicas; ++r) {
      if (!done[size_t(r)]) done[size_t(r)] = all_done(reqs[size_t(r)]);
      ok = ok && done[size_t(r)];
    }
    return ok;
  };
  if (poll_until(every, timeout_s)) return;
  std::string late;
  for (int r = 0; r < layout_.n_replicas; ++r)
    if (!done[size_t(r)]) late += cat(late.empty() ? "" : ", ", "replica ", r, " (", world_.rank_name(layout_.last_rank(r)), ")");
  LFM2_TIMEOUT("timed out after ", timeout_s, " s waiting for the results of ", late, " (did it stop? see --timeout)");
}

}  // namespace lfm2
