#include "io/partial_outputs.h"

#include <cstdio>

#include "common/error.h"
#include "io/h5_util.h"

namespace lfm2 {
namespace {

// An empty dataset of `rank` dims that grows along the first, chunked by `chunk` rows.
hid_t extendible(hid_t file, const char* name, hid_t type, int64_t width, const std::string& path) {
  const int rank = width > 0 ? 2 : 1;
  const hsize_t dims[2] = {0, hsize_t(width)}, max[2] = {H5S_UNLIMITED, hsize_t(width)};
  const hsize_t chunk[2] = {256, hsize_t(width > 0 ? width : 1)};
  H5Handle space(H5Screate_simple(rank, dims, max));
  H5Handle plist(H5Pcreate(H5P_DATASET_CREATE));
  H5_CHECK(H5Pset_chunk(plist.get(), rank, chunk), path, ": chunking ", name);
  const hid_t d = H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT);
  H5_CHECK(d, path, ": creating ", name);
  return d;
}

// Rows [at, at + n) of dataset d (grown to hold them) from `data`.
void write_rows(hid_t d, hid_t mem_type, int64_t at, int64_t n, int64_t width, const void* data,
                const std::string& path) {
  const int rank = width > 0 ? 2 : 1;
  const hsize_t size[2] = {hsize_t(at + n), hsize_t(width)};
  H5_CHECK(H5Dset_extent(d, size), path, ": growing a dataset");
  H5Handle space(H5Dget_space(d));
  const hsize_t start[2] = {hsize_t(at), 0}, count[2] = {hsize_t(n), hsize_t(width)};
  H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path, ": selecting rows");
  H5Handle mem(H5Screate_simple(rank, count, nullptr));
  H5_CHECK(H5Dwrite(d, mem_type, mem.get(), space.get(), H5P_DEFAULT, data), path, ": appending rows");
}

}  // namespace

std::string partial_path(const std::string& output) { return output + ".partial"; }

std::vector<int32_t> generated_row(const JournalRecord& r, int64_t K) {
  std::vector<int32_t> row(size_t(K), -1);
  const int64_t m = int64_t(r.tokens.size());
  for (int64_t t = 0; t < K; ++t) row[size_t(t)] = t < m ? r.tokens[size_t(t)] : r.ended_at_eos ? r.tokens.back() : -1;
  return row;
}

PartialOutputs::PartialOutputs(const std::string& path, int64_t K, const nlohmann::json& meta) : path_(path), K_(K) {
  h5_quiet();
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5_CHECK(file_, path, ": cannot create the partial output");
  h5_write_attr(file_, "partial", int64_t(1));
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (v.is_string()) h5_write_attr(file_, it.key(), v.get<std::string>());
    else if (v.is_boolean()) h5_write_attr(file_, it.key(), int64_t(v.get<bool>()));
    else if (v.is_number_integer()) h5_write_attr(file_, it.key(), v.get<int64_t>());
    else if (v.is_number()) h5_write_attr(file_, it.key(), v.get<double>());
  }
  seq_ = extendible(file_, "seq", H5T_STD_I64LE, 0, path);
  n_ = extendible(file_, "n_generated", H5T_STD_I32LE, 0, path);
  gen_ = extendible(file_, "generated", H5T_STD_I32LE, K, path);
}

PartialOutputs::~PartialOutputs() {
  for (int64_t* h : {&seq_, &n_, &gen_})
    if (*h >= 0) H5Dclose(*h), *h = -1;
  if (file_ >= 0) H5Fclose(file_);
}

void PartialOutputs::append(const std::vector<JournalRecord>& records) {
  if (records.empty()) return;
  const int64_t n = int64_t(records.size());
  std::vector<int64_t> seq;
  std::vector<int32_t> count, gen;
  for (const JournalRecord& r : records) {
    seq.push_back(r.seq);
    count.push_back(int32_t(r.tokens.size()));
    const std::vector<int32_t> row = generated_row(r, K_);
    gen.insert(gen.end(), row.begin(), row.end());
  }
  write_rows(seq_, H5T_NATIVE_INT64, rows_, n, 0, seq.data(), path_);
  write_rows(n_, H5T_NATIVE_INT32, rows_, n, 0, count.data(), path_);
  write_rows(gen_, H5T_NATIVE_INT32, rows_, n, K_, gen.data(), path_);
  rows_ += n;
}

void PartialOutputs::flush() { H5_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL), path_, ": flushing"); }

void PartialOutputs::remove() {
  for (int64_t* h : {&seq_, &n_, &gen_})
    if (*h >= 0) H5Dclose(*h), *h = -1;
  if (file_ >= 0) H5Fclose(file_);
  file_ = -1;
  std::remove(path_.c_str());
}

}  // namespace lfm2
