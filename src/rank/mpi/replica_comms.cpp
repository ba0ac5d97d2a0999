#include "rank/mpi/replica_comms.h"

#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace lfm2 {
namespace {

// What each rank tells every other: its node and host name.
struct NodeFacts {
  int node;
  char host[MPI_MAX_PROCESSOR_NAME];
};

}  // namespace

Replicas::Replicas(const WorldConfig& world, int n_stages) : world_(world) {
  NodeFacts mine{};
  mine.node = world.node;
  std::snprintf(mine.host, sizeof mine.host, "%s", world.host.c_str());
  std::vector<NodeFacts> all(size_t(world.size));
  MPI_CHECK(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, world.comm),
            "learning every rank's node");
  std::vector<int> nodes;
  for (const NodeFacts& f : all) {
    nodes.push_back(f.node);
    hosts_.emplace_back(f.host, strnlen(f.host, sizeof f.host));
  }
  layout_ = group_ranks(nodes, n_stages);
  // The job's last rank writes the output from every replica's last stage (report/result_gather.h).
  LFM2_CHECK(layout_.stage_of.back() == n_stages - 1, "replicas: rank ", world.size - 1, " is no last stage");
  world_.replica = layout_.replica_of[size_t(world.rank)];
  world_.n_replicas = layout_.n_replicas;

  const int stage = layout_.stage_of[size_t(world.rank)];
  MPI_CHECK(MPI_Comm_split(world.comm, world_.replica, stage, &comm_), "the replicas' communicators");
  // A new communicator inherits the error handler, but say it: errors must come back as codes.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  // The pipeline's host link (plans forward, chosen tokens back: engine/plan_link.h) on a twin of
  // it, so that its messages never match a transport's.
  MPI_CHECK(MPI_Comm_dup(comm_, &link_), "the replicas' host links");
  MPI_Comm_set_errhandler(link_, MPI_ERRORS_RETURN);
  pipe_ = world_;
  pipe_.comm = comm_;
  pipe_.link = link_;
  MPI_CHECK(MPI_Comm_rank(comm_, &pipe_.rank), "the replica's rank");
  MPI_CHECK(MPI_Comm_size(comm_, &pipe_.size), "the replica's size");
  LFM2_CHECK(pipe_.rank == stage && pipe_.size == n_stages, "replica ", world_.replica, ": rank ", pipe_.rank, " of ",
             pipe_.size, ", expected stage ", stage, " of ", n_stages);
  pipe_.world_ranks = layout_.ranks[size_t(world_.replica)];
}

Replicas::~Replicas() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && link_ != MPI_COMM_NULL) MPI_Comm_free(&link_);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace lfm2
