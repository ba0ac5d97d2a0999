#include "io/seq_params.h"

#include <cmath>

#include "common/error.h"
#include "io/h5_util.h"

namespace lfm2 {
namespace {

constexpr int64_t kMaxCount = int64_t(1) << 30;

// Rows [begin, end) of a 1-D dataset of N = `rows` values, if the file has it.
template <typename T>
void read_rows(hid_t file, const std::string& path, const char* name, hid_t mem_type, int64_t rows, int64_t begin,
               int64_t end, std::vector<T>* out) {
  if (!h5_exists(file, name)) return;
  H5Handle d(H5Dopen2(file, name, H5P_DEFAULT));
  H5_CHECK(d.get(), path, ": opening ", name);
  const std::vector<int64_t> shape = h5_dataset_shape(d.get());
  LFM2_CHECK(shape.size() == 1 && shape[0] == rows, path, ": dataset '", name, "' has ", shape.size() == 1 ? shape[0] : -1,
             " entries in ", shape.size(), " dimensions, expected ", rows, " (one per sequence)");
  H5Handle type(H5Dget_type(d.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  LFM2_CHECK(cls == H5T_INTEGER || cls == H5T_FLOAT, path, ": dataset '", name, "' is not numeric");
  const hsize_t start[1] = {hsize_t(begin)}, count[1] = {hsize_t(end - begin)};
  H5Handle space(H5Dget_space(d.get()));
  H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path, ": selecting ",
           name);
  H5Handle mem(H5Screate_simple(1, count, nullptr));
  out->resize(size_t(end - begin));
  H5_CHECK(H5Dread(d.get(), mem_type, mem.get(), space.get(), H5P_DEFAULT, out->data()), path, ": reading ", name);
}

}  // namespace

bool SeqParamsBlock::any() const {
  return !max_new_tokens.empty() || own_sampling();
}

bool SeqParamsBlock::own_sampling() const {
  return !top_k.empty() || !temperature.empty() || !top_p.empty() || !seed.empty();
}

SeqSettings SeqParamsBlock::resolve(int64_t i, const SeqSettings& flags, const std::string& path) const {
  SeqSettings s = flags;
  const int64_t row = begin + i;
  const size_t k = size_t(i);
  if (!max_new_tokens.empty() && max_new_tokens[k] != -1) {
    LFM2_CHECK(max_new_tokens[k] >= 1 && max_new_tokens[k] <= kMaxCount, path, ": sequence ", row, ": max_new_tokens ",
               max_new_tokens[k], " is outside [1, 2^30] (-1: the flag's)");
    s.max_new_tokens = max_new_tokens[k];
  }
  if (!temperature.empty() && temperature[k] != -1) {
    LFM2_CHECK(std::isfinite(temperature[k]) && temperature[k] >= 0, path, ": sequence ", row, ": temperature ",
               temperature[k], " is not a finite number >= 0 (-1: the flag's)");
    s.temperature = temperature[k];
  }
  if (!top_p.empty() && top_p[k] != -1) {
    LFM2_CHECK(top_p[k] > 0 && top_p[k] <= 1, path, ": sequence ", row, ": top_p ", top_p[k],
               " is outside (0, 1] (-1: the flag's)");
    s.top_p = top_p[k];
  }
  if (!top_k.empty() && top_k[k] != -1) {
    LFM2_CHECK(top_k[k] >= 0 && top_k[k] <= kMaxCount, path, ": sequence ", row, ": top_k ", top_k[k],
               " is outside [0, 2^30] (-1: the flag's)");
    s.top_k = top_k[k];
  }
  if (!seed.empty() && seed[k] != -1) {
    LFM2_CHECK(seed[k] >= 0, path, ": sequence ", row, ": seed ", seed[k], " is negative (-1: the flag's)");
    s.seed = uint64_t(seed[k]);
  }
  return s;
}

namespace {

template <typename T>
void write_one(hid_t file, const std::string& path, const char* name, hid_t type, const std::vector<T>& v) {
  if (v.empty()) return;
  const hsize_t dims[1] = {hsize_t(v.size())};
  H5Handle space(H5Screate_simple(1, dims, nullptr));
  H5Handle d(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(d.get(), path, ": creating ", name);
  H5_CHECK(H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), path, ": writing ", name);
}

}  // namespace

void write_seq_params(const std::string& path, const SeqParamsBlock& b) {
  h5_quiet();
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5_CHECK(f.get(), path, ": cannot open for writing");
  write_one(f.get(), path, "max_new_tokens", H5T_NATIVE_INT32, b.max_new_tokens);
  write_one(f.get(), path, "temperature", H5T_NATIVE_FLOAT, b.temperature);
  write_one(f.get(), path, "top_p", H5T_NATIVE_FLOAT, b.top_p);
  write_one(f.get(), path, "top_k", H5T_NATIVE_INT32, b.top_k);
  write_one(f.get(), path, "seed", H5T_NATIVE_INT64, b.seed);
}

SeqParamsBlock read_seq_params(const std::string& path, int64_t begin, int64_t end) {
  h5_quiet();
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5_CHECK(f.get(), path, ": cannot open");
  H5Handle ids(H5Dopen2(f.get(), "input_ids", H5P_DEFAULT));
  H5_CHECK(ids.get(), path, ": opening input_ids");
  const int64_t rows = h5_dataset_shape(ids.get()).at(0);
  LFM2_CHECK(0 <= begin && begin <= end && end <= rows, path, ": rows [", begin, ", ", end, ") of ", rows);
  SeqParamsBlock b;
  b.begin = begin;
  b.n = end - begin;
  read_rows(f.get(), path, "max_new_tokens", H5T_NATIVE_INT32, rows, begin, end, &b.max_new_tokens);
  read_rows(f.get(), path, "temperature", H5T_NATIVE_FLOAT, rows, begin, end, &b.temperature);
  read_rows(f.get(), path, "top_p", H5T_NATIVE_FLOAT, rows, begin, end, &b.top_p);
  read_rows(f.get(), path, "top_k", H5T_NATIVE_INT32, rows, begin, end, &b.top_k);
  read_rows(f.get(), path, "seed", H5T_NATIVE_INT64, rows, begin, end, &b.seed);
  return b;
}

}  // namespace lfm2
