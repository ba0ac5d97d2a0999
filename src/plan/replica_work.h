// The replicas' work: `mpirun -np R*P lfm2-rank --pipeline P` runs R copies (replicas) of a P-stage
// pipeline, each on its own block of the sequences (which ranks form each replica:
// rank/mpi/replica_layout.h).
//
// Work (split_sequences): contiguous blocks of the inputs in input order, one per replica,
// balanced by tokens, so that the outputs are the replicas' results concatenated. A replica pads
// its block only to its own longest prompt (ReplicaWork::width), and cuts it into microbatches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/microbatch.h"

namespace lfm2 {

// Sequences [begin, end) of the inputs.
struct SeqBlock {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  std::string name() const;  // "sequence 3", "sequences 6-11"
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
  int64_t n_micro() const { return n_microbatches(seqs.size(), microbatch); }
};

// Every replica's work: `microbatch` (--microbatch; 0: the default for the replica's own block,
// microbatch.h: scoring's, or generation's) applies per replica. full_width keeps every block at
// seq_len (--all-logits writes every position).
std::vector<ReplicaWork> plan_work(const std::vector<SeqBlock>& blocks, int64_t seq_len,
                                   const std::vector<int32_t>& lengths, bool full_width, int64_t microbatch,
                                   int n_stages, bool gpu, bool generation = false);

}  // namespace lfm2
