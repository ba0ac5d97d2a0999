#include "io/weight_file.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/file_kind.h"
#include "common/shape_text.h"

namespace lfm2 {
namespace {

int64_t row_elems(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Rows per I/O step so that one step moves about 64 MiB.
int64_t rows_per_step(const std::vector<int64_t>& shape, size_t elem_bytes) {
  int64_t row_bytes = std::max<int64_t>(1, row_elems(shape) * int64_t(elem_bytes));
  return std::max<int64_t>(1, (int64_t(64) << 20) / row_bytes);
}

// Selects rows [row_begin, row_begin + n_rows) of a dataset; returns the matching memory space.
H5Handle select_rows(hid_t space, const std::vector<int64_t>& shape, int64_t row_begin, int64_t n_rows) {
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  start[0] = hsize_t(row_begin);
  count[0] = hsize_t(n_rows);
  H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), "row selection");
  return H5Handle(H5Screate_simple(int(count.size()), count.data(), nullptr));
}

}  // namespace

// ---------------------------------------------------------------- writer

WeightWriter::WeightWriter(const std::string& path, const ModelConfig& cfg, DType weight_dtype)
    : path_(path), pending_(path), cfg_(cfg), config_json_(cfg.to_json_text()), weight_dtype_(weight_dtype) {
  h5_quiet();
  // No small-data aggregation: HDF5 would otherwise gather small datasets (norms) of every layer
  // into shared blocks early in the file, and a stage's bytes would no longer lie together.
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5_CHECK(H5Pset_small_data_block_size(fapl.get(), 0), path_, ": file access properties");
  file_ = H5Handle(H5Fcreate(pending_.tmp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  H5_CHECK(file_.get(), path_, ": cannot create file");
  h5_write_attr(file_.get(), "format", std::string(kWeightFormat));
  h5_write_attr(file_.get(), "format_version", kWeightFormatVersion);
  h5_write_attr(file_.get(), "config_json", config_json_);
  h5_write_attr(file_.get(), "weight_dtype", std::string(dtype_name(weight_dtype)));
}

WeightWriter::~WeightWriter() = default;

DType WeightWriter::stored_dtype(const TensorSpec& spec) const { return lfm2::stored_dtype(spec, weight_dtype_); }

void WeightWriter::create(const TensorSpec& spec) {
  h5_make_parents(file_.get(), spec.path);
  std::vector<hsize_t> dims(spec.shape.begin(), spec.shape.end());
  H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  // Contiguous, allocated now (so file order is call order), never pre-filled (no double write).
  H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), spec.path);
  H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), spec.path);
  H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), spec.path);
  // No modification times: the same weights give the same file, byte for byte.
  H5_CHECK(H5Pset_obj_track_times(dcpl.get(), 0), spec.path);
  H5Handle type = h5_file_type(stored_dtype(spec));
  H5Handle dset(H5Dcreate2(file_.get(), spec.path.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(),
                           H5P_DEFAULT));
  H5_CHECK(dset.get(), path_, ": creating dataset ", spec.path, " ", shape_tuple(spec.shape));
  Written& w = written_[spec.path];
  w = Written{};
  w.total_rows = spec.shape[0];
}

void WeightWriter::write_rows(const TensorSpec& spec, int64_t row_begin, int64_t n_rows, const void* data,
                              DType data_type) {
  LFM2_CHECK(row_begin >= 0 && n_rows >= 0 && row_begin + n_rows <= spec.shape[0], spec.path, ": rows [",
             row_begin, ", ", row_begin + n_rows, ") outside ", shape_tuple(spec.shape));
  if (n_rows == 0) return;
  const auto it = written_.find(spec.path);
  LFM2_CHECK(it != written_.end(), path_, ": ", spec.path, ": write_rows before create");
  LFM2_CHECK(it->second.rows == row_begin, path_, ": ", spec.path, ": rows written out of order (", row_begin,
             " after ", it->second.rows, ")");
  H5Handle dset(H5Dopen2(file_.get(), spec.path.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), path_, ": opening dataset ", spec.path);
  const DType stored = stored_dtype(spec);
  const size_t n = size_t(n_rows * row_elems(spec.shape));
  std::vector<char> converted;
  const void* src = data;
  if (stored != data_type) {
    converted.resize(n * dtype_size(stored));
    convert_elements(converted.data(), stored, data, data_type, n);
    src = converted.data();
  }
  H5Handle fspace(H5Dget_space(dset.get()));
  H5Handle mspace = select_rows(fspace.get(), spec.shape, row_begin, n_rows);
  H5Handle type = h5_file_type(stored);
  H5_CHECK(H5Dwrite(dset.get(), type.get(), mspace.get(), fspace.get(), H5P_DEFAULT, src), path_,
           ": writing dataset ", spec.path);
  it->second.hash.update(src, n * dtype_size(stored));
  it->second.rows += n_rows;
  bytes_written_ += int64_t(n * dtype_size(stored));
}

void WeightWriter::write(const TensorSpec& spec, const void* data, DType data_type) {
  create(spec);
  write_rows(spec, 0, spec.shape[0], data, data_type);
}

void WeightWriter::set_stage(const StageLayers& s) {
  h5_write_attr(file_.get(), "stage", int64_t(s.stage));
  h5_write_attr(file_.get(), "n_stages", int64_t(s.n_stages));
  h5_write_attr(file_.get(), "layer_begin", int64_t(s.layer_begin));
  h5_write_attr(file_.get(), "layer_end", int64_t(s.layer_end));
}

void WeightWriter::set_attr(const std::string& name, const std::string& value) {
  h5_write_attr(file_.get(), name, value);
}

uint64_t WeightWriter::digest(const std::string& dataset) const {
  LFM2_CHECK(has_whole(dataset), path_, ": ", dataset, " has not been written whole");
  return written_.at(dataset).hash.digest();
}

bool WeightWriter::has_whole(const std::string& dataset) const {
  const auto it = written_.find(dataset);
  return it != written_.end() && it->second.rows == it->second.total_rows;
}

void WeightWriter::set_identity(const ModelIdentity& id) { identity_ = id; }

void WeightWriter::commit() {
  const std::vector<TensorSpec> specs = model_tensor_specs(cfg_);
  write_model_text(file_.get(), text_);
  if (identity_) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (written_.count(specs[i].path))
        LFM2_CHECK(digest(specs[i].path) == identity_->tensor_digests[i], path_, ": tensor '", specs[i].path,
                   "' as written (", hex64(digest(specs[i].path)), ") differs from its digest in the model (",
                   hex64(identity_->tensor_digests[i]), "): the source is damaged");
    write_model_identity(file_.get(), *identity_);
  } else {
    bool whole = true;
    for (const TensorSpec& s : specs) whole = whole && has_whole(s.path);
    if (whole) {
      ModelIdentity id;
      for (const TensorSpec& s : specs) id.tensor_digests.push_back(digest(s.path));
      id.fingerprint = model_fingerprint(config_json_, weight_dtype_, specs, id.tensor_digests);
      write_model_identity(file_.get(), id);
    }
  }
  H5_CHECK(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), path_, ": flushing");
  hid_t id = file_.release();  // close explicitly to see the error
  H5_CHECK(H5Fclose(id), path_, ": closing");
  pending_.commit();
}

// ---------------------------------------------------------------- reader

WeightReader::WeightReader(const std::string& path) : path_(path) {
  h5_quiet();
  LFM2_CHECK(std::filesystem::exists(path), path, ": no such file");
  check_input_file("weight file", path);  // never open a FIFO: it would block
  LFM2_CHECK(H5Fis_hdf5(path.c_str()) > 0, path, ": not an HDF5 file (or truncated)");
  file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5_CHECK(file_.get(), path, ": cannot open");
  const hid_t f = file_.get();
  LFM2_CHECK(h5_has_attr(f, "format") && h5_read_attr_string(f, "format", path) == kWeightFormat, path,
             ": not an lfm2-rank weight file (root attribute format != \"", kWeightFormat, "\")");
  int64_t version = h5_read_attr_int(f, "format_version", path);
  LFM2_CHECK(version == kWeightFormatVersion, path, ": format_version ", version, " is not supported (expected ",
             kWeightFormatVersion, ")");
  config_ = ModelConfig::from_json_text(h5_read_attr_string(f, "config_json", path), path + ": config_json");
  weight_dtype_ = parse_dtype(h5_read_attr_string(f, "weight_dtype", path));
  if (h5_has_attr(f, "stage")) {
    stage_.has_value_ = true;
    stage_.info.stage = int(h5_read_attr_int(f, "stage", path));
    stage_.info.n_stages = int(h5_read_attr_int(f, "n_stages", path));
    stage_.info.layer_begin = int(h5_read_attr_int(f, "layer_begin", path));
    stage_.info.layer_end = int(h5_read_attr_int(f, "layer_end", path));
  }
  const std::vector<TensorSpec> specs = model_tensor_specs(config_);
  for (size_t i = 0; i < specs.size(); ++i) tensor_index_[specs[i].path] = i;
  identity_ = read_model_identity(f, path, h5_read_attr_string(f, "config_json", path), weight_dtype_, specs);
}

uint64_t WeightReader::expected_digest(const std::string& dataset) const {
  LFM2_CHECK(identity_, path_, ": no tensor digests (written by an older h5pack)");
  const auto it = tensor_index_.find(dataset);
  LFM2_CHECK(it != tensor_index_.end(), path_, ": '", dataset, "' is no tensor of the model");
  return identity_->tensor_digests[it->second];
}

void WeightReader::check_digest(const std::string& dataset, int64_t row_begin, int64_t n_rows, int64_t total_rows,
                                const void* data, size_t bytes) {
  if (!verify_ || !identity_ || !tensor_index_.count(dataset)) return;
  auto it = reading_.find(dataset);
  if (row_begin == 0) it = reading_.insert_or_assign(dataset, Reading{}).first;
  if (it == reading_.end()) return;
  if (it->second.next_row != row_begin) {  // out of order: this pass is not checked
    reading_.erase(it);
    return;
  }
  it->second.hash.update(data, bytes);
  it->second.next_row += n_rows;
  if (it->second.next_row < total_rows) return;
  const uint64_t got = it->second.hash.digest(), want = expected_digest(dataset);
  reading_.erase(it);
  LFM2_CHECK(got == want, path_, ": tensor '", dataset, "' does not match its digest (read ", hex64(got),
             ", recorded ", hex64(want), "): the file is damaged; `h5pack verify ", path_, "` checks it whole");
  ++tensors_verified_;
}

bool WeightReader::has(const std::string& dataset) const { return h5_exists(file_.get(), dataset); }

std::vector<int64_t> WeightReader::shape(const std::string& dataset) const {
  LFM2_CHECK(has(dataset), path_, ": dataset '", dataset, "' is missing");
  H5Handle dset(H5Dopen2(file_.get(), dataset.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), path_, ": opening dataset ", dataset);
  return h5_dataset_shape(dset.get());
}

DType WeightReader::dtype(const std::string& dataset) const {
  LFM2_CHECK(has(dataset), path_, ": dataset '", dataset, "' is missing");
  H5Handle dset(H5Dopen2(file_.get(), dataset.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), path_, ": opening dataset ", dataset);
  H5Handle type(H5Dget_type(dset.get()));
  return h5_dtype_of(type.get(), path_ + ": " + dataset);
}

int64_t WeightReader::storage_bytes(const std::string& dataset) const {
  H5Handle dset(H5Dopen2(file_.get(), dataset.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), path_, ": opening dataset ", dataset);
  return int64_t(H5Dget_storage_size(dset.get()));
}

void WeightReader::read_rows_raw(const std::string& dataset, int64_t row_begin, int64_t n_rows, void* out) {
  H5Handle dset(H5Dopen2(file_.get(), dataset.c_str(), H5P_DEFAULT));
  H5_CHECK(dset.get(), path_, ": opening dataset ", dataset);
  auto shape = h5_dataset_shape(dset.get());
  LFM2_CHECK(!shape.empty() && row_begin >= 0 && n_rows >= 0 && row_begin + n_rows <= shape[0], path_, ": ",
             dataset, ": rows [", row_begin, ", ", row_begin + n_rows, ") outside ", shape_tuple(shape));
  if (n_rows == 0) return;
  H5Handle type(H5Dget_type(dset.get()));
  DType stored = h5_dtype_of(type.get(), path_ + ": " + dataset);
  H5Handle fspace(H5Dget_space(dset.get()));
  H5Handle mspace = select_rows(fspace.get(), shape, row_begin, n_rows);
  H5Handle mtype = h5_file_type(stored);
  H5_CHECK(H5Dread(dset.get(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, out), path_,
           ": reading dataset ", dataset);
  const int64_t bytes = n_rows * row_elems(shape) * int64_t(dtype_size(stored));
  bytes_read_ += bytes;
  check_digest(dataset, row_begin, n_rows, shape[0], out, size_t(bytes));
}

void WeightReader::read(const TensorSpec& spec, void* out, DType want) {
  read_rows(spec, 0, spec.shape.empty() ? 0 : spec.shape[0], out, want);
}

void WeightReader::read_rows(const TensorSpec& spec, int64_t row_begin, int64_t n_rows, void* out, DType want) {
  LFM2_CHECK(has(spec.path), path_, ": dataset '", spec.path, "' is missing");
  auto got = shape(spec.path);
  LFM2_CHECK(got == spec.shape, path_, ": dataset '", spec.path, "' has shape ", shape_tuple(got), ", expected ",
             shape_tuple(spec.shape));
  const DType stored = dtype(spec.path);
  if (stored == want) {
    read_rows_raw(spec.path, row_begin, n_rows, out);
    return;
  }
  // Convert step by step so that a large tensor needs only a bounded staging buffer.
  const int64_t step = rows_per_step(spec.shape, dtype_size(stored)), per_row = row_elems(spec.shape);
  std::vector<char> staging(size_t(std::min(step, std::max<int64_t>(n_rows, 1)) * per_row) * dtype_size(stored));
  for (int64_t r = 0; r < n_rows; r += step) {
    int64_t n = std::min(step, n_rows - r);
    read_rows_raw(spec.path, row_begin + r, n, staging.data());
    convert_elements(static_cast<char*>(out) + size_t(r * per_row) * dtype_size(want), want, staging.data(), stored,
                     size_t(n * per_row));
  }
}

std::vector<float> WeightReader::read_f32(const TensorSpec& spec) {
  std::vector<float> out(size_t(spec.numel()));
  read(spec, out.data(), DType::F32);
  return out;
}

}  // namespace lfm2
