// Replicas x pipeline: `mpirun -np R*P lfm2-rank --pipeline P` runs R copies (replicas) of a
// P-stage pipeline, each on its own block of the sequences. This file is the pure part: which ranks
// form each replica, and which sequences each replica runs (replica_world.h does the MPI side).
//
// Grouping (group_ranks): a replica's stages exchange hidden states at every microbatch, replicas
// exchange nothing until the results, so a replica's stages go on one node wherever they fit
// (NVLink, shared memory). Each node's ranks, in rank order, make as many whole replicas as they
// can; the ranks left over (nodes whose rank count P does not divide) are pooled, node after node,
// into replicas that span nodes. Replicas are numbered by their lowest rank and a replica's stages
// are its ranks in increasing order: rank 0 is stage 0 of replica 0, and the job's highest rank is
// the last stage of its replica (it writes the output).
//
// Work (split_sequences): contiguous blocks of the inputs in input order, one per replica,
// balanced by tokens, so that the outputs are the replicas' results concatenated. A replica pads
// its block only to its own longest prompt (ReplicaWork::width).
#pragma once

#include <cstdint>
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

// Sequences [begin, end) of the inputs.
struct SeqBlock {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// What a sequence costs: its prompt's tokens (lengths[i], or seq_len without lengths) plus the
// tokens generated after it.
std::vector<int64_t> sequence_costs(int64_t n_seq, int64_t seq_len, const std::vector<int32_t>& lengths,
                                    int64_t new_tokens);

// Cuts the sequences into n_blocks contiguous, non-empty blocks: block r ends where the running
// cost comes closest to (r + 1) / n_blocks of the total (equal costs: block sizes differ by at most
// one). Throws when there are fewer sequences than blocks.
std::vector<SeqBlock> split_sequences(const std::vector<int64_t>& costs, int n_blocks);

// What one replica runs: its block of sequences padded to `width` tokens, in microbatches.
struct ReplicaWork {
  SeqBlock seqs;
  int64_t width = 0;       // the longest prompt of the block (the inputs' width with --all-logits)
  int64_t microbatch = 1;  // sequences per microbatch
  int64_t n_micro() const { return (seqs.size() + microbatch - 1) / microbatch; }
};

// Every replica's work: `microbatch` (--microbatch; 0: the default for the replica's own block,
// stage_plan.h) applies per replica. full_width keeps every block at seq_len (--all-logits writes
// every position).
std::vector<ReplicaWork> plan_work(const std::vector<SeqBlock>& blocks, int64_t seq_len,
                                   const std::vector<int32_t>& lengths, bool full_width, int64_t microbatch,
                                   int n_stages, bool gpu);

}  // namespace lfm2
