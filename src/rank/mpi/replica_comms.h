// The MPI side of replicas (replica_layout.h): every rank learns every rank's node, the ranks are grouped
// into replicas, and MPI_COMM_WORLD is split into one communicator per replica (MPI_Comm_split,
// ranks in stage order). A replica's pipeline, its MPI transport and the NCCL communicators of its
// CUDA transport (whose unique ids travel on it) live on that communicator, so none spans two
// replicas; what concerns the whole job (the start-up agreements, the model check, the results,
// the exit code) stays on MPI_COMM_WORLD.
#pragma once

#include <string>
#include <vector>

#include "plan/replica_work.h"
#include "rank/mpi/replica_layout.h"
#include "rank/mpi/world.h"

namespace lfm2 {

class Replicas {
 public:
  // Collective over MPI_COMM_WORLD and blocking (main() bounds it with the watchdog). n_stages
  // must divide world.size.
  Replicas(const WorldConfig& world, int n_stages);
  ~Replicas();
  Replicas(const Replicas&) = delete;
  Replicas& operator=(const Replicas&) = delete;

  const ReplicaLayout& layout() const { return layout_; }
  // The job: MPI_COMM_WORLD, with this rank's replica filled in.
  const WorldConfig& world() const { return world_; }
  // This rank's pipeline: rank = stage, size = stages, comm = its replica's communicator.
  const WorldConfig& pipe() const { return pipe_; }
  // Every rank's host name (MPI_Get_processor_name), in rank order.
  const std::vector<std::string>& hosts() const { return hosts_; }

 private:
  ReplicaLayout layout_;
  WorldConfig world_, pipe_;
  std::vector<std::string> hosts_;
  MPI_Comm comm_ = MPI_COMM_NULL, link_ = MPI_COMM_NULL;
};

}  // namespace lfm2
