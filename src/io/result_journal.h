// The journal of a generation job's finished sequences (issue 20): what --resume trusts.
//
// An append-only file beside the output ("<output>.journal"): one header line (a JSON object: the
// job's identity, what a resumed run must match), then one record per finished sequence
//
//   u32 payload bytes | i64 seq | i32 n tokens | u8 ended at an EOS | i32 tokens[n] | u32 CRC-32 of the payload
//
// (little-endian: common/byte_codec.h), written in batches, each followed by fsync (flush()). A job
// killed in the middle of a batch leaves a torn last record: reading stops at the first record whose
// length or checksum is wrong, and the file is cut back to the records before it, which are exactly
// what was done.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lfm2 {

struct JournalRecord {
  int64_t seq = 0;
  bool ended_at_eos = false;
  std::vector<int32_t> tokens;
};

class ResultJournal {
 public:
  // A new journal at `path` (replacing any), its header `identity`.
  static ResultJournal create(const std::string& path, const nlohmann::json& identity);
  // An existing journal: its header and records (a torn tail cut off); appends go after them.
  static ResultJournal resume(const std::string& path, nlohmann::json* identity, std::vector<JournalRecord>* records);

  ResultJournal(ResultJournal&& o) noexcept;
  ResultJournal& operator=(ResultJournal&&) = delete;
  ResultJournal(const ResultJournal&) = delete;
  ~ResultJournal();

  void append(const JournalRecord& r);  // buffered
  void flush();                         // written and fsync'ed
  int64_t records() const { return records_; }
  const std::string& path() const { return path_; }
  // Closes and deletes the file (the job's output is committed).
  void remove();

 private:
  ResultJournal(std::string path, std::FILE* f, int64_t records) : path_(std::move(path)), f_(f), records_(records) {}

  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> pending_;
  int64_t records_ = 0;
};

// "<output>.journal"
std::string journal_path(const std::string& output);

}  // namespace lfm2
