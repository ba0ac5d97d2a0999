// Which ranks form each replica (`mpirun -np R*P lfm2-rank --pipeline P`: R copies of a P-stage
// pipeline). Pure; replica_comms.h does the MPI side, plan/replica_work.h the sequences each runs.
//
// Grouping (group_ranks): a replica's stages exchange hidden states at every microbatch, replicas
// exchange nothing until the results, so a replica's stages go on one node wherever they fit
// (NVLink, shared memory). Each node's ranks, in rank order, make as many whole replicas as they
// can; the ranks left over (nodes whose rank count P does not divide) are pooled, node after node,
// into replicas that span nodes. Replicas are numbered by their lowest rank and a replica's stages
// are its ranks in increasing order: rank 0 is stage 0 of replica 0, and the job's highest rank is
// the last stage of its replica (it writes the output).
#pragma once

#include <string>
#include <vector>

namespace lfm2 {

struct ReplicaLayout {
  int n_replicas = 1, n_stages = 1;
  std::vector<std::vector<int>> ranks;    // per replica: its ranks (MPI_COMM_WORLD), stage by stage
  std::vector<int> replica_of, stage_of;  // per rank

  int n_ranks() const { return n_replicas * n_stages; }
  int last_rank(int replica) const { return ranks[size_t(replica)].back(); }
  // "ranks 0-2", "ranks 0, 4, 5" or "rank 3": the ranks of a replica.
  std::string rank_list(int replica) const;
};

// node_of_rank[r]: an id shared by exactly the ranks of rank r's node (e.g. its lowest rank), for
// every rank of the job. n_stages must divide the number of ranks.
ReplicaLayout group_ranks(const std::vector<int>& node_of_rank, int n_stages);

}  // namespace lfm2
