#include "rank/jobs/result_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rank/report/run_report.h"

namespace lfm2 {
namespace {

// "1h02m", "4m05s", "12s"
std::string duration_text(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const int64_t t = int64_t(s + 0.5), h = t / 3600, m = t / 60 % 60, sec = t % 60;
  char buf[32];
  if (h) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)h, (long long)m);
  else if (m) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)m, (long long)sec);
  else std::snprintf(buf, sizeof buf, "%llds", (long long)sec);
  return buf;
}

// Whether the progress line may update in place: stdout is a terminal, and so is the launcher's
// (Open MPI hands every process a pseudo-terminal, whatever its own stdout is: a log then gets
// plain lines).
bool on_terminal() {
  if (!::isatty(::fileno(stdout))) return false;
  char buf[256];
  const std::string fd = "/proc/" + std::to_string(::getppid()) + "/fd/1";
  const ssize_t n = ::readlink(fd.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  const std::string target(buf, size_t(n));
  return target.rfind("/dev/pts/", 0) == 0 || target.rfind("/dev/tty", 0) == 0;
}

// The first setting in which a journal's job differs from this one.
void check_same_job(const nlohmann::json& theirs, const nlohmann::json& mine, const std::string& path) {
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const auto t = theirs.find(it.key());
    LFM2_CHECK(t != theirs.end() && *t == it.value(), "--resume: ", path, " is the journal of another job: its ",
               it.key(), " is ", t == theirs.end() ? std::string("missing") : t->dump(), ", this run's ",
               it.value().dump(), " (run without --resume to start afresh)");
  }
}

}  // namespace

ResultWriter::ResultWriter(const WriterOptions& options)
    : opt_(options), done_(size_t(options.n_seq), false), tokens_(size_t(options.n_seq)),
      eos_(size_t(options.n_seq), 0) {
  start_s_ = last_flush_s_ = last_progress_s_ = now_s();
  flush_records_ = opt_.flush_every_records > 0 ? opt_.flush_every_records : std::max<int64_t>(1, opt_.n_seq / 200);
  terminal_ = on_terminal();
  if (opt_.output.empty()) return;
  const std::string jpath = journal_path(opt_.output);
  std::vector<JournalRecord> records;
  if (opt_.resume) {
    nlohmann::json theirs;
    journal_.emplace(ResultJournal::resume(jpath, &theirs, &records));
    check_same_job(theirs, opt_.identity, jpath);
  } else {
    if (std::filesystem::exists(jpath))
      log_info(cat("--output: starting afresh over the journal of an unfinished job (", jpath,
                   "); --resume would have gone on from it"));
    journal_.emplace(ResultJournal::create(jpath, opt_.identity));
  }
  partial_ = std::make_unique<PartialOutputs>(partial_path(opt_.output), opt_.max_new_tokens, opt_.meta);
  for (JournalRecord& r : records) {
    LFM2_CHECK(r.seq >= 0 && r.seq < opt_.n_seq && !done_[size_t(r.seq)], jpath, ": sequence ", r.seq,
               " is out of place in the journal");
    done_[size_t(r.seq)] = true;
    eos_[size_t(r.seq)] = r.ended_at_eos;
    tokens_[size_t(r.seq)] = r.tokens;
  }
  partial_->append(records);
  partial_->flush();
  n_done_ = n_resumed_ = int64_t(records.size());
  if (opt_.resume)
    log_info(cat("resume: ", n_resumed_, " of ", opt_.n_seq, " sequences done before (", jpath, "); ",
                 opt_.n_seq - n_resumed_, " to run"));
}

void ResultWriter::start() { start_s_ = last_flush_s_ = last_progress_s_ = now_s(); }

void ResultWriter::add(FinishedSeq&& f, int replica) {
  (void)replica;
  LFM2_CHECK(f.seq >= 0 && f.seq < opt_.n_seq && !done_[size_t(f.seq)], "results: sequence ", f.seq,
             " finished twice");
  done_[size_t(f.seq)] = true;
  ++n_done_;
  f.n_tokens = int32_t(f.tokens.size());
  new_tokens_ += f.n_tokens;
  eos_[size_t(f.seq)] = f.ended_at_eos;
  if (journal_) unflushed_.push_back({f.seq, f.ended_at_eos, f.tokens});
  tokens_[size_t(f.seq)] = std::move(f.tokens);
  f.tokens.clear();
  finished_.push_back(std::move(f));
}

void ResultWriter::flush() {
  if (!journal_ || unflushed_.empty()) return;
  partial_->append(unflushed_);
  partial_->flush();
  for (const JournalRecord& r : unflushed_) journal_->append(r);
  journal_->flush();
  unflushed_.clear();
}

void ResultWriter::tick(int64_t pages_in_use, int64_t n_pages) {
  pages_ = pages_in_use;
  pool_ = n_pages;
  const double t = now_s();
  if (t - last_flush_s_ >= opt_.flush_every_s || int64_t(unflushed_.size()) >= flush_records_) {
    flush();
    last_flush_s_ = t;
  }
  if (t - last_progress_s_ >= (terminal_ ? 0.5 : opt_.progress_every_s)) {
    progress(false);
    last_progress_s_ = t;
  }
}

void ResultWriter::finish_run() {
  flush();
  progress(true);
}

void ResultWriter::progress(bool final) {
  const double t = now_s() - start_s_;
  const int64_t run = n_done_ - n_resumed_, left = opt_.n_seq - n_done_;
  const double eta = run > 0 ? t / double(run) * double(left) : -1;
  const std::string line =
      cat("progress: ", n_done_, "/", opt_.n_seq, " sequences (", fixed(100.0 * double(n_done_) / double(opt_.n_seq), 1),
          "%), ", fixed(t > 0 ? double(new_tokens_) / t : 0, 1), " tokens/s, pages ", pages_, "/", pool_, ", ",
          final ? cat("done in ", duration_text(t)) : cat("ETA ", duration_text(eta)));
  if (terminal_) {
    std::printf("\r%s%s\033[K%s", log_prefix().c_str(), line.c_str(), final ? "\n" : "");
    std::fflush(stdout);
  } else {
    log_info(line);
  }
}

double ResultWriter::run_s() const { return now_s() - start_s_; }

GenerateResult ResultWriter::result() const {
  const int64_t N = opt_.n_seq, K = opt_.max_new_tokens;
  GenerateResult r;
  r.n_new = K;
  r.generated.assign(size_t(N * K), -1);
  r.n_generated.assign(size_t(N), 0);
  for (int64_t s = 0; s < N; ++s) {
    LFM2_CHECK(done_[size_t(s)], "generation: sequence ", s, " never finished");
    const std::vector<int32_t> row = generated_row({s, eos_[size_t(s)] != 0, tokens_[size_t(s)]}, K);
    std::copy(row.begin(), row.end(), r.generated.begin() + s * K);
    r.n_generated[size_t(s)] = int32_t(tokens_[size_t(s)].size());
  }
  return r;
}

void ResultWriter::remove_partial() {
  if (partial_) partial_->remove();
  if (journal_) journal_->remove();
}

}  // namespace lfm2
