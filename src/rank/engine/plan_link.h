// A pipeline's host link (continuous batching): each item's plan travels from stage r to r + 1 on
// the host, sent as stage r queues the item (ahead of its hidden states, so that no device stage
// waits on its GPU to learn what comes next), and the last stage's chosen tokens of each item
// travel back to the first stage's scheduler. MPI on the replica's twin communicator
// (WorldConfig::link), so that its messages never match a transport's; messages between two ranks
// arrive in the order sent. Every wait polls against --timeout and names the peer.
//
//   plan    to_bytes(plan)                         stage r -> r + 1
//   end     an empty message: the run is over      stage r -> r + 1
//   tokens  int64 item, then int32 per token       last stage -> first stage
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "rank/engine/step_plan.h"
#include "rank/mpi/world.h"

namespace lfm2 {

class PlanLink {
 public:
  PlanLink(const WorldConfig& pipe, double timeout_s);
  ~PlanLink();
  PlanLink(const PlanLink&) = delete;
  PlanLink& operator=(const PlanLink&) = delete;

  void send_plan(const StepPlan& plan);  // to the next stage
  void send_end();                       // to the next stage

  enum class Got { kNone, kPlan, kEnd };
  // The next plan from the previous stage: waits for it (up to the timeout; throws naming the
  // previous stage) when `wait`, else kNone when none has arrived.
  Got recv_plan(StepPlan* plan, bool wait);

  // Last stage: an item's chosen tokens to the first stage.
  void send_tokens(int64_t item, const int32_t* tokens, int64_t n);
  // First stage: the next item's tokens from the last stage (in item order), waiting when `wait`;
  // false when none has arrived (and !wait).
  bool recv_tokens(int64_t* item, std::vector<int32_t>* tokens, bool wait);

  // Waits for every send to complete (the end of a run).
  void flush();

 private:
  bool probe(int peer, std::vector<uint8_t>* bytes, bool wait, const char* what);
  void post(std::vector<uint8_t> bytes, int peer);
  void release_sent();

  WorldConfig pipe_;
  double timeout_s_;
  struct Send {
    std::vector<uint8_t> bytes;
    MPI_Request req;
  };
  std::deque<Send> sends_;
};

}  // namespace lfm2
