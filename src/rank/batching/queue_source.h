// A replica's prompts with continuous batching (continuous_job.h's PromptSource): the sequences the
// job hub grants it (job_hub.h), read from the inputs file as they are granted, never all at once:
// each run of consecutive sequences is one HDF5 hyperslab, only up to its longest prompt, checked
// (ids inside the vocabulary) as it is read. Asks for up to `ask` more once half of them are used.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "io/seq_params.h"
#include "rank/batching/continuous_job.h"
#include "rank/batching/job_hub.h"

namespace lfm2 {

class QueueSource final : public PromptSource {
 public:
  // lengths: every prompt's length (empty: all seq_len); settings: every sequence's parameters.
  QueueSource(JobHub& hub, std::string path, const std::vector<int32_t>& lengths, int64_t seq_len,
              const std::vector<SeqSettings>& settings, int64_t vocab, int64_t max_positions, int64_t ask);
  Next next(SeqRequest* request, std::vector<int32_t>* ids) override;

 private:
  void read(const std::vector<int64_t>& seqs);
  int32_t length(int64_t s) const { return lengths_.empty() ? int32_t(seq_len_) : lengths_[size_t(s)]; }

  JobHub& hub_;
  std::string path_;
  const std::vector<int32_t>& lengths_;
  int64_t seq_len_;
  const std::vector<SeqSettings>& settings_;
  int64_t vocab_, max_positions_, ask_;
  std::deque<std::pair<SeqRequest, std::vector<int32_t>>> ready_;
};

}  // namespace lfm2
