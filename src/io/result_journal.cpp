#include "io/result_journal.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/byte_codec.h"
#include "common/error.h"

namespace lfm2 {
namespace {

constexpr uint32_t kMaxPayload = 1u << 30;

uint32_t crc32(const uint8_t* p, size_t n) {
  static uint32_t table[256] = {0};
  if (!table[1])
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// One record from `bytes` at `at` (advanced past it); false at a torn or corrupt record.
bool parse(const std::vector<uint8_t>& bytes, size_t* at, JournalRecord* r) {
  const size_t left = bytes.size() - *at;
  if (left < 4) return false;
  const uint32_t n = read_le<uint32_t>(bytes.data() + *at);
  if (n < 13 || n > kMaxPayload || left < 4 + size_t(n) + 4) return false;
  const uint8_t* p = bytes.data() + *at + 4;
  if (crc32(p, n) != read_le<uint32_t>(p + n)) return false;
  const int32_t count = read_le<int32_t>(p + 8);
  if (count < 0 || 13 + size_t(count) * 4 != n) return false;
  r->seq = read_le<int64_t>(p);
  r->ended_at_eos = p[12] != 0;
  r->tokens.resize(size_t(count));
  for (int32_t k = 0; k < count; ++k) r->tokens[size_t(k)] = read_le<int32_t>(p + 13 + 4 * size_t(k));
  *at += 4 + n + 4;
  return true;
}

}  // namespace

std::string journal_path(const std::string& output) { return output + ".journal"; }

ResultJournal ResultJournal::create(const std::string& path, const nlohmann::json& identity) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  LFM2_CHECK(f, path, ": cannot create the journal: ", std::strerror(errno));
  ResultJournal j(path, f, 0);
  const std::string head = identity.dump() + "\n";
  j.pending_.assign(head.begin(), head.end());
  j.flush();
  return j;
}

ResultJournal ResultJournal::resume(const std::string& path, nlohmann::json* identity,
                                    std::vector<JournalRecord>* records) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  LFM2_CHECK(f, path, ": cannot open the journal to resume from: ", std::strerror(errno),
             " (run without --resume to start afresh)");
  std::vector<uint8_t> bytes(std::filesystem::file_size(path));
  const size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  LFM2_CHECK(got == bytes.size(), path, ": cannot read the journal");
  const auto nl = std::find(bytes.begin(), bytes.end(), uint8_t('\n'));
  LFM2_CHECK(nl != bytes.end(), path, ": not a journal of lfm2-rank (no header)");
  try {
    *identity = nlohmann::json::parse(bytes.begin(), nl);
  } catch (const std::exception&) {
    LFM2_FAIL(path, ": not a journal of lfm2-rank (its header is no JSON object)");
  }
  size_t at = size_t(nl - bytes.begin()) + 1;
  records->clear();
  JournalRecord r;
  while (parse(bytes, &at, &r)) records->push_back(r);
  // Cut a torn tail, so that appends follow the last whole record (a whole journal stays as it is).
  LFM2_CHECK((at == bytes.size() || ::ftruncate(::fileno(f), off_t(at)) == 0) && std::fseek(f, long(at), SEEK_SET) == 0,
             path, ": cannot cut the journal's torn tail: ", std::strerror(errno));
  return ResultJournal(path, f, int64_t(records->size()));
}

ResultJournal::ResultJournal(ResultJournal&& o) noexcept
    : path_(std::move(o.path_)), f_(o.f_), pending_(std::move(o.pending_)), records_(o.records_) {
  o.f_ = nullptr;
}

ResultJournal::~ResultJournal() {
  if (f_) std::fclose(f_);
}

void ResultJournal::append(const JournalRecord& r) {
  const size_t start = pending_.size();
  put_le<uint32_t>(pending_, uint32_t(13 + r.tokens.size() * 4));
  put_le<int64_t>(pending_, r.seq);
  put_le<int32_t>(pending_, int32_t(r.tokens.size()));
  pending_.push_back(r.ended_at_eos ? 1 : 0);
  for (int32_t t : r.tokens) put_le<int32_t>(pending_, t);
  put_le<uint32_t>(pending_, crc32(pending_.data() + start + 4, pending_.size() - start - 4));
  ++records_;
}

void ResultJournal::flush() {
  LFM2_CHECK(f_, path_, ": the journal is closed");
  if (!pending_.empty())
    LFM2_CHECK(std::fwrite(pending_.data(), 1, pending_.size(), f_) == pending_.size(), path_,
               ": cannot write the journal: ", std::strerror(errno));
  pending_.clear();
  LFM2_CHECK(std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0, path_, ": cannot write the journal: ",
             std::strerror(errno));
}

void ResultJournal::remove() {
  if (f_) std::fclose(f_);
  f_ = nullptr;
  std::remove(path_.c_str());
}

}  // namespace lfm2
