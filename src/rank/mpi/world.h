// WorldConfig: where this process sits in the MPI job, asked once at start-up; and how a rank
// waits for others: every wait polls against a deadline (poll_until), so that a rank that stopped
// is named instead of waited for forever.
//
// rank / size come from MPI_COMM_WORLD; local_rank / local_size from MPI_Comm_split_type
// (MPI_COMM_TYPE_SHARED), i.e. the ranks on this node, which is what picks a GPU; hosts[r] is rank
// r's host (gathered once, by MPI_COMM_WORLD rank), so that a message about another rank can say
// where it runs. Everything else (the pipeline, the transport, logging) asks this struct instead of
// calling MPI again.
//
// With replicas (replicas.h) a rank has two of them: the job's (MPI_COMM_WORLD: the start-up
// agreements, the results) and its pipeline's (rank = stage, size = stages, comm = the replica's
// own communicator), which the pipeline, its transport and its jobs use.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"


namespace lfm2 {

struct WorldConfig {
  int rank = 0, size = 1;              // in comm
  int local_rank = 0, local_size = 1;  // on this node
  int node = 0;                        // the lowest MPI_COMM_WORLD rank on this node: names the node
  std::string host;                    // processor name
  std::vector<std::string> hosts;      // every rank's processor name, by MPI_COMM_WORLD rank
  MPI_Comm comm = MPI_COMM_WORLD;      // MPI_COMM_WORLD, or a replica's pipeline (not owned)
  MPI_Comm link = MPI_COMM_NULL;       // a pipeline's host link: a twin of comm (engine/plan_link.h)
  int replica = 0, n_replicas = 1;     // this rank's replica (replicas.h)
  std::vector<int> world_ranks;        // rank in comm -> rank in MPI_COMM_WORLD (empty: the same)

  int world_rank(int r) const { return world_ranks.empty() ? r : world_ranks[size_t(r)]; }

  bool is_first() const { return rank == 0; }
  bool is_last() const { return rank == size - 1; }
  int prev() const { return rank - 1; }  // upstream stage (valid unless is_first)
  int next() const { return rank + 1; }  // downstream stage (valid unless is_last)
  // Whether the job's ranks run on more than one host.
  bool multi_host() const;
  // How messages name rank r of comm, as the launcher and the log prefix do: by its MPI_COMM_WORLD
  // rank, with replicas also by replica and stage, and its host when the job spans several:
  // "rank 2", "rank 5 (replica 1 stage 2)", "rank 5 (replica 1 stage 2) on node-b".
  std::string rank_name(int r) const;
  // Where rank r of comm runs ("" when unknown).
  std::string host_of(int r) const;
};

// Reads the world from an initialised MPI (one MPI_Comm_split_type and an allreduce on it, freed
// again; one allgather of the host names).
WorldConfig query_world();

// "rank 1", "ranks 2-3", across hosts "ranks 2-3 on node-b, rank 5 on node-c" (runs of ranks of
// comm on one host); with replicas each rank by its rank_name.
std::string name_ranks(const WorldConfig& world, const std::vector<int>& ranks);

// Owns MPI_Init_thread / MPI_Finalize for main(); errors on the communicator are returned, not
// fatal, so that our checks can report them in one line.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// A barrier waited for against timeout_s; `what` names it in a timeout, and rank 0's timeout also
// names the ranks (and hosts) that did not arrive.
void barrier(const WorldConfig& world, double timeout_s, const std::string& what);

// Every rank's `mine`, in rank order, on rank 0 (empty elsewhere); non-blocking collectives waited
// for against timeout_s (a dead rank cannot hang the others here).
std::vector<std::string> gather_strings(const WorldConfig& world, const std::string& mine, double timeout_s,
                                        const std::string& what);

// Polls `done()` with a short spin and then sleeps growing to 1 ms, until it returns true or
// `timeout_s` passes (then returns false): the one polling loop behind every wait for another rank.
bool poll_until(const std::function<bool()>& done, double timeout_s);

// Waits for a non-blocking MPI collective (MPI_Iallreduce, ...) with a deadline; throws on timeout.
void wait_mpi_request(MPI_Request* req, double timeout_s, const std::string& what);

// "MPI_Isend: MPI_ERR_RANK: invalid rank" from an MPI return code (MPI_CHECK, common/error.h).
std::string mpi_error_string(int code);

}  // namespace lfm2
