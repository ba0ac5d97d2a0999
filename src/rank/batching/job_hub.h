// The hub of a continuous generation job (issue 20), on the job's rank 0: the shared queue of
// sequences every replica pulls from as it has room (output lengths are not known in advance, so
// no fixed blocks), and where every replica's finished sequences go (result_writer.h writes them).
//
// Replica 0's first stage is rank 0 itself and calls the server directly; every other replica's
// first stage is a client over MPI_COMM_WORLD: it asks for sequences ahead of need (one request
// outstanding at a time), sends finished sequences in batches, and says when it is done. The server
// answers whenever rank 0 passes by (serve(): never waits), which it does at every step and in its
// waits; after its own replica is done it serves until every replica is.
//
//   request  client -> 0   i64 how many sequences it wants
//   grant    0 -> client   i64 sequence indices (input order); none: the queue is empty
//   results  client -> 0   records: i64 seq, i32 n, u8 EOS, i32 tokens[n], f64 times[3]
//   done     client -> 0   empty: the replica finished everything it was granted
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "rank/batching/batch_scheduler.h"
#include "rank/mpi/replica_layout.h"
#include "rank/mpi/world.h"

namespace lfm2 {

// Where a replica's first stage gets its sequences and sends its results: the server itself on
// rank 0, a client elsewhere.
class JobHub {
 public:
  virtual ~JobHub() = default;
  // Up to n sequences granted now (input order); empty with more_later() while a request is on
  // its way, empty and !more_later() when the queue is done.
  virtual std::vector<int64_t> take(int64_t n) = 0;
  virtual bool more_later() const = 0;
  virtual void finished(FinishedSeq&& f) = 0;
  // Passes by: answers (server) or sends and receives (client) what is due, never waiting.
  virtual void serve() = 0;
  // This replica is done: the rest of its results and the done message; the server then serves
  // until every replica is done (--timeout after the last one heard of).
  virtual void replica_done() = 0;
};

class HubServer final : public JobHub {
 public:
  using Sink = std::function<void(FinishedSeq&&, int replica)>;
  // pending: the sequences to run, in input order.
  HubServer(const WorldConfig& world, const ReplicaLayout& layout, std::vector<int64_t> pending, Sink sink,
            double timeout_s);
  std::vector<int64_t> take(int64_t n) override;
  bool more_later() const override { return false; }
  void finished(FinishedSeq&& f) override { sink_(std::move(f), 0); }
  void serve() override;
  void replica_done() override;

 private:
  void answer(int rank);
  void receive_results(int rank);

  WorldConfig world_;
  ReplicaLayout layout_;
  std::deque<int64_t> pending_;
  Sink sink_;
  double timeout_s_;
  std::vector<bool> done_;  // per replica
  int64_t heard_ = 0;       // results messages received
  std::vector<std::vector<int64_t>> grants_;  // per rank: a grant in flight (kept until sent)
  std::vector<MPI_Request> grant_reqs_;
};

class HubClient final : public JobHub {
 public:
  HubClient(const WorldConfig& world, double timeout_s);
  ~HubClient();
  std::vector<int64_t> take(int64_t n) override;
  bool more_later() const override { return !queue_done_; }
  void finished(FinishedSeq&& f) override;
  void serve() override;
  void replica_done() override;

 private:
  void send_results(uint8_t kind);
  void wait_sends();

  WorldConfig world_;
  double timeout_s_;
  bool asked_ = false, queue_done_ = false;
  int64_t want_ = 0;
  std::vector<int64_t> granted_;
  std::vector<uint8_t> results_;  // records not yet sent
  int64_t n_results_ = 0;
  double last_send_s_ = 0;
  std::deque<std::pair<std::vector<uint8_t>, MPI_Request>> sends_;
};

// Serialising finished sequences (the results message).
void put_finished(std::vector<uint8_t>& out, const FinishedSeq& f);
std::vector<FinishedSeq> take_finished(const uint8_t* bytes, size_t n);

}  // namespace lfm2
