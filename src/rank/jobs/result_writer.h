// Where a continuous generation job's finished sequences go, on the job's rank 0 (issue 20): every
// replica's, as they finish (job_hub.h). With --output they are journaled (io/result_journal.h:
// what --resume trusts) and appended to the partial output (io/partial_outputs.h), both flushed at a
// steady cadence; a resumed job starts from the journal's sequences and never runs them again. One
// progress line at a steady cadence (sequences done/total, tokens/s, pages in use, ETA: in place on
// a terminal, plain lines in a log). At the end the results as the outputs hold them, and the
// metrics of the run (--metrics).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/partial_outputs.h"
#include "io/result_journal.h"
#include "rank/batching/batch_scheduler.h"
#include "rank/jobs/generate_job.h"

namespace lfm2 {

struct WriterOptions {
  int64_t n_seq = 0;           // N
  int64_t max_new_tokens = 1;  // K of the outputs
  std::string output;          // empty: nothing journaled
  nlohmann::json identity;     // what a resumed job must match (the journal's header)
  nlohmann::json meta;         // the partial output's attributes
  bool resume = false;
  double flush_every_s = 1.0;     // the journal's cadence: this often,
  int64_t flush_every_records = 0; // or after this many new sequences (0: N / 200, at least 1)
  double progress_every_s = 10.0;  // in a log; on a terminal every 0.5 s, in place
};

class ResultWriter {
 public:
  // With resume: reads the journal, refuses one of another job (naming the first setting that
  // differs), writes the partial output afresh from it.
  explicit ResultWriter(const WriterOptions& options);

  // The sequences already done (a resumed job skips them).
  const std::vector<bool>& done() const { return done_; }
  int64_t n_done() const { return n_done_; }
  int64_t n_resumed() const { return n_resumed_; }

  // The run starts now (the progress's clock).
  void start();
  // A finished sequence (times in seconds from the run's start on its replica).
  void add(FinishedSeq&& f, int replica);
  // At every step: flushes and prints when due. pages: rank 0's pages in use and in its pool.
  void tick(int64_t pages_in_use, int64_t n_pages);
  // The end of the run: the last flush and progress line.
  void finish_run();
  // Every sequence's tokens as the outputs hold them; throws naming a sequence that never finished.
  GenerateResult result() const;
  // After the final output is committed: the journal and partial output go.
  void remove_partial();

  // Per-sequence figures of this run (not of resumed sequences), for --metrics.
  const std::vector<FinishedSeq>& finished() const { return finished_; }
  double run_s() const;
  int64_t new_tokens() const { return new_tokens_; }

 private:
  void flush();
  void progress(bool final);

  WriterOptions opt_;
  std::vector<bool> done_;
  std::vector<std::vector<int32_t>> tokens_;  // per sequence
  std::vector<uint8_t> eos_;
  int64_t n_done_ = 0, n_resumed_ = 0, new_tokens_ = 0;
  std::optional<ResultJournal> journal_;
  std::unique_ptr<PartialOutputs> partial_;
  std::vector<JournalRecord> unflushed_;
  std::vector<FinishedSeq> finished_;
  double start_s_ = 0, last_flush_s_ = 0, last_progress_s_ = 0;
  int64_t pages_ = 0, pool_ = 0, flush_records_ = 1;
  bool terminal_ = false;
};

}  // namespace lfm2
