// Safetensors header parsing and validation, and pread-based tensor reads (see safetensors.h).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_kind.h"
#include "common/shape_text.h"

namespace lfm2 {
namespace fs = std::filesystem;

namespace {

// Larger headers are certainly corrupt (real ones are a few hundred KiB).
constexpr uint64_t kMaxHeaderBytes = uint64_t(256) << 20;

void pread_all(int fd, void* out, uint64_t n, uint64_t offset, const std::string& file, const std::string& what) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    LFM2_CHECK(got >= 0, file, ": reading ", what, ": ", std::strerror(errno));
    LFM2_CHECK(got > 0, file, ": ", what, ": unexpected end of file (truncated)");
    p += got;
    n -= uint64_t(got);
    offset += uint64_t(got);
  }
}

// A shard's header: the JSON and where the data that its offsets count from lies in the file.
struct ShardHeader {
  nlohmann::json json;
  uint64_t data_begin = 0, data_size = 0;
};

// The 8-byte little-endian length, then that many bytes of JSON (an object), each checked against
// the file's size.
ShardHeader read_header(int fd, const std::string& file) {
  struct stat st;
  LFM2_CHECK(::fstat(fd, &st) == 0, file, ": cannot stat: ", std::strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  LFM2_CHECK(size >= 8, file, ": truncated (", size, " bytes, shorter than the 8-byte header length)");
  unsigned char len_bytes[8];
  pread_all(fd, len_bytes, 8, 0, file, "header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  LFM2_CHECK(header_len <= kMaxHeaderBytes, file, ": header length ", header_len,
             " is implausible (corrupt or not a safetensors file)");
  LFM2_CHECK(8 + header_len <= size, file, ": truncated (header of ", header_len, " bytes but file has ", size,
             " bytes)");
  std::string text(size_t(header_len), '\0');
  pread_all(fd, text.data(), header_len, 8, file, "header");
  ShardHeader h;
  try {
    h.json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(file, ": invalid header JSON (", e.what(), ")"));
  }
  LFM2_CHECK(h.json.is_object(), file, ": header JSON is not an object");
  h.data_begin = 8 + header_len;
  h.data_size = size - h.data_begin;
  return h;
}

// One tensor's header entry (dtype, shape, data_offsets), checked: a known dtype, whole
// dimensions, offsets in order, inside the data and as long as the shape needs.
SafeTensorInfo header_entry(const std::string& name, const nlohmann::json& t, const std::string& file,
                            uint64_t data_begin, uint64_t data_size) {
  const std::string where = cat(file, ": tensor '", name, "'");
  LFM2_CHECK(t.is_object() && t.contains("dtype") && t.contains("shape") && t.contains("data_offsets"), where,
             ": header entry needs dtype, shape and data_offsets");
  LFM2_CHECK(t["dtype"].is_string(), where, ": dtype is not a string");
  SafeTensorInfo info;
  info.name = name;
  info.file = file;
  const std::string dt = t["dtype"].get<std::string>();
  LFM2_CHECK(safetensors_dtype(dt, &info.dtype), where, ": unsupported dtype ", dt, " (expected BF16, F16, F32 or F8_E4M3)");
  LFM2_CHECK(t["shape"].is_array(), where, ": shape is not an array");
  uint64_t numel = 1;
  for (const auto& d : t["shape"]) {
    LFM2_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, where, ": shape ", t["shape"].dump(),
               " has a bad dimension");
    info.shape.push_back(d.get<int64_t>());
    numel *= uint64_t(d.get<int64_t>());
  }
  const auto& off = t["data_offsets"];
  LFM2_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             where, ": data_offsets ", off.dump(), " is not [begin, end]");
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  LFM2_CHECK(b <= e, where, ": data_offsets [", b, ", ", e, "] run backwards");
  LFM2_CHECK(e <= data_size, where, ": data_offsets [", b, ", ", e, "] past the end of the data (", data_size,
             " bytes): file truncated or corrupt");
  info.nbytes = e - b;
  LFM2_CHECK(info.nbytes == numel * dtype_size(info.dtype), where, ": ", info.nbytes, " bytes but shape ",
             shape_list(info.shape), " x ", dt, " needs ", numel * dtype_size(info.dtype));
  info.offset = data_begin + b;
  return info;
}

}  // namespace

bool safetensors_dtype(const std::string& s, DType* out) {
  if (s == "BF16") *out = DType::BF16;
  else if (s == "F16") *out = DType::F16;
  else if (s == "F32") *out = DType::F32;
  else if (s == "F8_E4M3") *out = DType::E4M3;  // published FP8 checkpoints' weights
  else return false;
  return true;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::E4M3: return "F8_E4M3";
  }
  return "?";
}

int64_t SafeTensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) : path_(path) {
  try {
    std::string index;
    if (fs::is_directory(path)) {
      if (fs::exists(fs::path(path) / "model.safetensors")) {
        open_shard((fs::path(path) / "model.safetensors").string());
        return;
      }
      index = (fs::path(path) / "model.safetensors.index.json").string();
      LFM2_CHECK(fs::exists(index), path, ": no model.safetensors or model.safetensors.index.json in directory");
    } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
      index = path;
    } else {
      open_shard(path);
      return;
    }
    check_input_file("safetensors index", index);
    std::ifstream in(index);
    LFM2_CHECK(in.good(), index, ": cannot open index");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat(index, ": invalid JSON (", e.what(), ")"));
    }
    LFM2_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index,
               ": no \"weight_map\" object");
    std::map<std::string, std::string> wanted;  // tensor -> shard path
    std::vector<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      LFM2_CHECK(it.value().is_string(), index, ": weight_map entry '", it.key(), "' is not a file name");
      const std::string shard = (fs::path(index).parent_path() / it.value().get<std::string>()).string();
      wanted[it.key()] = shard;
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    }
    LFM2_CHECK(!shards.empty(), index, ": weight_map is empty");
    for (const auto& s : shards) {
      LFM2_CHECK(fs::exists(s), index, ": shard ", s, " named in weight_map does not exist");
      open_shard(s);
    }
    for (const auto& [name, shard] : wanted) {
      auto it = tensors_.find(name);
      LFM2_CHECK(it != tensors_.end(), index, ": tensor '", name, "' is mapped to ", shard, " but is not in it");
      LFM2_CHECK(it->second.file == shard, index, ": tensor '", name, "' is mapped to ", shard, " but lies in ",
                 it->second.file);
    }
  } catch (...) {
    for (auto& [f, fd] : fds_) ::close(fd);
    fds_.clear();
    throw;
  }
}

SafetensorsCheckpoint::~SafetensorsCheckpoint() {
  for (auto& [f, fd] : fds_) ::close(fd);
}

void SafetensorsCheckpoint::open_shard(const std::string& file) {
  check_input_file("safetensors file", file);  // never open a FIFO: it would block
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  LFM2_CHECK(fd >= 0, file, ": cannot open: ", std::strerror(errno));
  fds_[file] = fd;
  files_.push_back(file);
  const ShardHeader h = read_header(fd, file);
  std::vector<std::pair<uint64_t, std::string>> ranges;  // begin -> name, for the overlap check
  for (auto it = h.json.begin(); it != h.json.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    SafeTensorInfo info = header_entry(it.key(), it.value(), file, h.data_begin, h.data_size);
    auto prev = tensors_.find(info.name);
    LFM2_CHECK(prev == tensors_.end(), file, ": tensor '", info.name, "': also present in ",
               prev == tensors_.end() ? "" : prev->second.file, " (duplicated across shards)");
    if (info.nbytes > 0) ranges.push_back({info.offset - h.data_begin, info.name});
    tensors_.emplace(info.name, std::move(info));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& a = tensors_.at(ranges[i - 1].second);
    LFM2_CHECK(ranges[i].first >= a.offset - h.data_begin + a.nbytes, file, ": tensor '", ranges[i].second,
               "' overlaps tensor '", a.name, "' (corrupt data_offsets)");
  }
}

const SafeTensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  auto it = tensors_.find(name);
  LFM2_CHECK(it != tensors_.end(), path_, ": tensor '", name, "' is missing");
  return it->second;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

void SafetensorsCheckpoint::read(const std::string& name, void* out) const {
  const auto& t = info(name);
  pread_all(fds_.at(t.file), out, t.nbytes, t.offset, t.file, cat("tensor '", name, "'"));
}

void SafetensorsCheckpoint::read_elements(const std::string& name, uint64_t elem_begin, uint64_t n_elems,
                                          void* out) const {
  const auto& t = info(name);
  const uint64_t es = dtype_size(t.dtype);
  LFM2_CHECK(elem_begin + n_elems <= t.nbytes / es, t.file, ": tensor '", name, "': elements [", elem_begin, ", ",
             elem_begin + n_elems, ") outside its ", t.nbytes / es);
  pread_all(fds_.at(t.file), out, n_elems * es, t.offset + elem_begin * es, t.file, cat("tensor '", name, "'"));
}

}  // namespace lfm2
