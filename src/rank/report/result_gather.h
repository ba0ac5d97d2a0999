// The results of every replica, in input order, on the rank that writes them: the job's last rank
// (the last stage of its replica, mpi/replica_layout.h), which validates them and writes the output once.
//
// Each replica's last stage holds the rows of its block of sequences, in a few fields (next
// tokens, margins, logits; generated tokens and their counts). ResultGather moves every field of
// every replica at once over MPI_COMM_WORLD: the writer posts all its receives, straight into the
// output arrays, before it waits for any, so one late replica cannot hold up another's sends, and
// a replica whose rows do not arrive within --timeout is named ("replica 1 (rank 3)"). Messages
// are cut below MPI's int count. With one replica the writer only copies its own rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/replica_work.h"
#include "rank/mpi/replica_layout.h"
#include "rank/mpi/world.h"

namespace lfm2 {

class ResultGather {
 public:
  // Every rank of the job builds one and calls run(); ranks that are no replica's last stage
  // neither send nor receive.
  ResultGather(const WorldConfig& world, const ReplicaLayout& layout, std::vector<SeqBlock> blocks);

  // One field: `mine`, on a replica's last stage, holds its block's rows of `row_elems` values; on
  // the writer `all` is resized to every block's rows and receives them in block (= input) order.
  template <typename T>
  void add(const std::vector<T>& mine, int64_t row_elems, std::vector<T>* all) {
    if (writer()) all->resize(size_t(blocks_.back().end * row_elems));
    add_bytes(mine.data(), mine.size() * sizeof(T), size_t(row_elems) * sizeof(T), all->data());
  }

  // Moves every field; throws (TimeoutError) past timeout_s naming the replicas not heard from.
  void run(double timeout_s);

 private:
  struct Field {
    const void* mine;
    size_t mine_bytes, row_bytes;
    void* all;
  };
  bool writer() const { return world_.is_last(); }
  void add_bytes(const void* mine, size_t mine_bytes, size_t row_bytes, void* all);

  WorldConfig world_;
  ReplicaLayout layout_;
  std::vector<SeqBlock> blocks_;
  std::vector<Field> fields_;
};

}  // namespace lfm2
