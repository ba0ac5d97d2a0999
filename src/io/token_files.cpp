#include "io/token_files.h"

#include <cstdio>
#include <filesystem>

#include "common/file_kind.h"
#include "common/pending_file.h"
#include "common/shape_text.h"
#include "io/h5_util.h"

namespace lfm2 {
namespace {

H5Handle open_read(const std::string& path, const char* kind) {
  h5_quiet();
  LFM2_CHECK(!path.empty(), "no ", kind, " file given");
  LFM2_CHECK(std::filesystem::exists(path), path, ": no such ", kind, " file");
  check_input_file(cat(kind, " file"), path);  // never open a FIFO: it would block
  LFM2_CHECK(H5Fis_hdf5(path.c_str()) > 0, path, ": not an HDF5 file (or truncated)");
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  H5_CHECK(f.get(), path, ": cannot open");
  return f;
}

// Opens `name`, checks its type class and rank, returns the dataset and its shape.
H5Handle open_dataset(hid_t file, const std::string& path, const std::string& name, H5T_class_t cls, int rank,
                      std::vector<int64_t>* shape) {
  LFM2_CHECK(h5_exists(file, name), path, ": no dataset '", name, "'");
  H5Handle d(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  H5_CHECK(d.get(), path, ": opening ", name);
  H5Handle type(H5Dget_type(d.get()));
  LFM2_CHECK(H5Tget_class(type.get()) == cls, path, ": dataset '", name, "' has the wrong type (expected ",
             cls == H5T_INTEGER ? "integers" : "floats", ")");
  *shape = h5_dataset_shape(d.get());
  LFM2_CHECK(int(shape->size()) == rank, path, ": dataset '", name, "' has shape ", shape_tuple(*shape),
             ", expected rank ", rank);
  return d;
}

template <typename T>
void read_all(hid_t dset, hid_t mem_type, std::vector<T>* out, int64_t n, const std::string& what) {
  out->resize(size_t(n));
  if (n == 0) return;
  H5_CHECK(H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()), what);
}

// An output HDF5 file under a temporary name that becomes `path` on commit() (common/pending_file.h).
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : pending_(path) {
    h5_quiet();
    file_ = H5Fcreate(pending_.tmp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5_CHECK(file_, path, ": cannot create file");
  }
  ~AtomicFile() {
    if (file_ >= 0) H5Fclose(file_);  // before pending_ removes the temporary file
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  hid_t get() const { return file_; }

  void write(const std::string& name, hid_t file_type, hid_t mem_type, const std::vector<int64_t>& shape,
             const void* data) {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
    H5Handle d(H5Dcreate2(file_, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5_CHECK(d.get(), pending_.path(), ": creating ", name);
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    if (n > 0)
      H5_CHECK(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), pending_.path(), ": writing ", name);
  }

  void commit() {
    const hid_t id = file_;
    file_ = -1;
    H5_CHECK(H5Fclose(id), pending_.path(), ": closing");
    pending_.commit();
  }

 private:
  PendingFile pending_;
  hid_t file_ = -1;  // closed by hand in commit() to see the error
};

}  // namespace

TokenInputs read_inputs(const std::string& path) {
  const TokenInputs head = read_inputs_header(path);
  return read_inputs_block(path, 0, head.n_seq, head.seq_len);
}

TokenInputs read_inputs_header(const std::string& path) {
  H5Handle f = open_read(path, "inputs");
  std::vector<int64_t> shape;
  H5Handle d = open_dataset(f.get(), path, "input_ids", H5T_INTEGER, 2, &shape);
  TokenInputs in;
  in.n_seq = shape[0];
  in.seq_len = shape[1];
  LFM2_CHECK(in.n_seq > 0, path, ": input_ids ", shape_tuple(shape), " holds no sequences");
  LFM2_CHECK(in.seq_len > 0, path, ": input_ids ", shape_tuple(shape), " holds empty sequences");
  if (h5_exists(f.get(), "lengths")) {
    H5Handle l = open_dataset(f.get(), path, "lengths", H5T_INTEGER, 1, &shape);
    LFM2_CHECK(shape[0] == in.n_seq, path, ": lengths ", shape_tuple(shape), " does not match input_ids (", in.n_seq,
               " sequences)");
    read_all(l.get(), H5T_NATIVE_INT32, &in.lengths, in.n_seq, path + ": reading lengths");
    for (int64_t i = 0; i < in.n_seq; ++i)
      LFM2_CHECK(in.lengths[size_t(i)] >= 1 && in.lengths[size_t(i)] <= in.seq_len, path, ": lengths[", i, "] = ",
                 in.lengths[size_t(i)], " is outside [1, ", in.seq_len, "] (the padded row length)");
  }
  return in;
}

const std::vector<std::string>& request_datasets() {
  static const std::vector<std::string> names{"request_id", "stop", "lengths", "max_new_tokens"};
  return names;
}

InputsProvenance read_inputs_provenance(const std::string& path) {
  H5Handle f = open_read(path, "inputs");
  InputsProvenance p;
  for (const std::string& name : request_datasets())
    if (p.missing_dataset.empty() && !h5_exists(f.get(), name)) p.missing_dataset = name;
  if (h5_has_attr(f.get(), "text_fingerprint")) p.text_fingerprint = h5_read_attr_string(f.get(), "text_fingerprint", path);
  return p;
}

TokenInputs read_inputs_block(const std::string& path, int64_t begin, int64_t end, int64_t width) {
  H5Handle f = open_read(path, "inputs");
  std::vector<int64_t> shape;
  H5Handle d = open_dataset(f.get(), path, "input_ids", H5T_INTEGER, 2, &shape);
  LFM2_CHECK(0 <= begin && begin < end && end <= shape[0] && 0 < width && width <= shape[1], path,
             ": rows [", begin, ", ", end, ") x ", width, " tokens are not inside input_ids ", shape_tuple(shape));
  TokenInputs in;
  in.n_seq = end - begin;
  in.seq_len = width;
  in.ids.resize(size_t(in.n_seq * width));
  const hsize_t start[2] = {hsize_t(begin), 0}, count[2] = {hsize_t(in.n_seq), hsize_t(width)};
  H5Handle file_space(H5Dget_space(d.get()));
  H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path,
           ": selecting rows of input_ids");
  H5Handle mem_space(H5Screate_simple(2, count, nullptr));
  H5_CHECK(H5Dread(d.get(), H5T_NATIVE_INT32, mem_space.get(), file_space.get(), H5P_DEFAULT, in.ids.data()), path,
           ": reading input_ids");
  if (h5_exists(f.get(), "lengths")) {
    H5Handle l = open_dataset(f.get(), path, "lengths", H5T_INTEGER, 1, &shape);
    H5Handle lspace(H5Dget_space(l.get()));
    H5_CHECK(H5Sselect_hyperslab(lspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path,
             ": selecting lengths");
    H5Handle lmem(H5Screate_simple(1, count, nullptr));
    in.lengths.resize(size_t(in.n_seq));
    H5_CHECK(H5Dread(l.get(), H5T_NATIVE_INT32, lmem.get(), lspace.get(), H5P_DEFAULT, in.lengths.data()), path,
             ": reading lengths");
    for (int64_t i = 0; i < in.n_seq; ++i)
      LFM2_CHECK(in.lengths[size_t(i)] >= 1 && in.lengths[size_t(i)] <= width, path, ": lengths[", begin + i, "] = ",
                 in.lengths[size_t(i)], " is outside [1, ", width, "]", width == shape[1] ? " (the padded row length)" : "");
  }
  return in;
}

void check_input_shape(const TokenInputs& in, int64_t max_positions, const std::string& path) {
  LFM2_CHECK(in.seq_len <= max_positions, path, ": sequences of ", in.seq_len,
             " tokens are longer than the model's max_position_embeddings ", max_positions);
}

void check_inputs(const TokenInputs& in, int64_t vocab, int64_t max_positions, const std::string& path,
                  int64_t first_row) {
  check_input_shape(in, max_positions, path);
  for (int64_t s = 0; s < in.n_seq; ++s)
    for (int64_t p = 0; p < in.length(s); ++p) {
      const int32_t t = in.ids[size_t(s * in.seq_len + p)];
      LFM2_CHECK(t >= 0 && t < vocab, path, ": input_ids[", first_row + s, ", ", p, "] = ", t,
                 " is outside the vocabulary [0, ", vocab, ")");
    }
}

void zero_padding(TokenInputs& in) {
  for (int64_t s = 0; s < in.n_seq; ++s)
    for (int64_t p = in.length(s); p < in.seq_len; ++p) in.ids[size_t(s * in.seq_len + p)] = 0;
}

TokenAnswers read_answers(const std::string& path) {
  H5Handle f = open_read(path, "answers");
  TokenAnswers a;
  std::vector<int64_t> shape;
  H5Handle d = open_dataset(f.get(), path, "next_token", H5T_INTEGER, 1, &shape);
  a.n_seq = shape[0];
  read_all(d.get(), H5T_NATIVE_INT32, &a.next_token, a.n_seq, path + ": reading next_token");
  if (h5_exists(f.get(), "logits")) {
    H5Handle l = open_dataset(f.get(), path, "logits", H5T_FLOAT, 2, &shape);
    LFM2_CHECK(shape[0] == a.n_seq, path, ": logits ", shape_tuple(shape), " does not match next_token (", a.n_seq, ",)");
    a.vocab = shape[1];
    read_all(l.get(), H5T_NATIVE_FLOAT, &a.logits, shape[0] * shape[1], path + ": reading logits");
  }
  if (h5_exists(f.get(), "generated")) {
    H5Handle g = open_dataset(f.get(), path, "generated", H5T_INTEGER, 2, &shape);
    LFM2_CHECK(shape[0] == a.n_seq, path, ": generated ", shape_tuple(shape), " does not match next_token (", a.n_seq,
               ",)");
    a.n_new = shape[1];
    read_all(g.get(), H5T_NATIVE_INT32, &a.generated, shape[0] * shape[1], path + ": reading generated");
  }
  return a;
}

void check_answers(const TokenAnswers& ans, int64_t n_seq, int64_t vocab, const std::string& path) {
  LFM2_CHECK(ans.n_seq == n_seq, path, ": next_token has ", ans.n_seq, " entries, the inputs have ", n_seq,
             " sequences");
  LFM2_CHECK(!ans.has_logits() || ans.vocab == vocab, path, ": logits (", ans.n_seq, ", ", ans.vocab,
             ") do not match the model's vocabulary of ", vocab);
  for (int64_t i = 0; i < ans.n_seq; ++i)
    LFM2_CHECK(ans.next_token[i] >= 0 && ans.next_token[i] < vocab, path, ": next_token[", i, "] = ", ans.next_token[i],
               " is outside the vocabulary [0, ", vocab, ")");
}

void write_outputs(const std::string& path, const TokenOutputs& out, const nlohmann::json& metadata) {
  LFM2_CHECK(int64_t(out.next_token.size()) == out.n_seq, path, ": next_token size mismatch");
  LFM2_CHECK(out.logits.empty() || int64_t(out.logits.size()) == out.n_seq * out.vocab, path, ": logits size mismatch");
  LFM2_CHECK(out.margin.empty() || int64_t(out.margin.size()) == out.n_seq, path, ": margin size mismatch");
  LFM2_CHECK(out.all_logits.empty() || int64_t(out.all_logits.size()) == out.n_seq * out.seq_len * out.vocab, path,
             ": all_logits size mismatch");
  AtomicFile f(path);
  f.write("next_token", H5T_STD_I32LE, H5T_NATIVE_INT32, {out.n_seq}, out.next_token.data());
  if (!out.margin.empty()) f.write("margin", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {out.n_seq}, out.margin.data());
  if (!out.logits.empty())
    f.write("logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {out.n_seq, out.vocab}, out.logits.data());
  if (!out.all_logits.empty())
    f.write("all_logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {out.n_seq, out.seq_len, out.vocab}, out.all_logits.data());
  if (!out.generated.empty()) {
    LFM2_CHECK(int64_t(out.generated.size()) == out.n_seq * out.n_new, path, ": generated size mismatch");
    LFM2_CHECK(int64_t(out.n_generated.size()) == out.n_seq, path, ": n_generated size mismatch");
    f.write("generated", H5T_STD_I32LE, H5T_NATIVE_INT32, {out.n_seq, out.n_new}, out.generated.data());
    f.write("n_generated", H5T_STD_I32LE, H5T_NATIVE_INT32, {out.n_seq}, out.n_generated.data());
  }
  if (!out.copy_from.empty()) {
    H5Handle src(H5Fopen(out.copy_from.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    LFM2_CHECK(src.valid(), out.copy_from, ": cannot open it to copy its request fields into ", path);
    for (const std::string& name : out.copy_datasets)
      if (H5Lexists(src.get(), name.c_str(), H5P_DEFAULT) > 0)
        LFM2_CHECK(H5Ocopy(src.get(), name.c_str(), f.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0, path,
                   ": cannot copy ", name, " from ", out.copy_from);
  }
  for (auto it = metadata.begin(); it != metadata.end(); ++it) {
    const auto& v = it.value();
    if (v.is_string())
      h5_write_attr(f.get(), it.key(), v.get<std::string>());
    else if (v.is_boolean())
      h5_write_attr(f.get(), it.key(), int64_t(v.get<bool>()));
    else if (v.is_number_integer())
      h5_write_attr(f.get(), it.key(), v.get<int64_t>());
    else if (v.is_number())
      h5_write_attr(f.get(), it.key(), v.get<double>());
    else
      h5_write_attr(f.get(), it.key(), v.dump());
  }
  f.commit();
}

void write_inputs(const std::string& path, const TokenInputs& in) {
  LFM2_CHECK(int64_t(in.ids.size()) == in.n_seq * in.seq_len, path, ": input_ids size mismatch");
  LFM2_CHECK(in.lengths.empty() || int64_t(in.lengths.size()) == in.n_seq, path, ": lengths size mismatch");
  AtomicFile f(path);
  f.write("input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {in.n_seq, in.seq_len}, in.ids.data());
  if (!in.lengths.empty()) f.write("lengths", H5T_STD_I32LE, H5T_NATIVE_INT32, {in.n_seq}, in.lengths.data());
  f.commit();
}

TokenOutputs read_outputs(const std::string& path) {
  TokenAnswers a = read_answers(path);
  TokenOutputs out;
  out.n_seq = a.n_seq;
  out.vocab = a.vocab;
  out.next_token = std::move(a.next_token);
  out.logits = std::move(a.logits);
  out.n_new = a.n_new;
  out.generated = std::move(a.generated);
  H5Handle f = open_read(path, "outputs");
  if (h5_exists(f.get(), "n_generated")) {
    std::vector<int64_t> shape;
    H5Handle d = open_dataset(f.get(), path, "n_generated", H5T_INTEGER, 1, &shape);
    read_all(d.get(), H5T_NATIVE_INT32, &out.n_generated, shape[0], path + ": n_generated");
  }
  if (h5_exists(f.get(), "margin")) {
    std::vector<int64_t> shape;
    H5Handle d = open_dataset(f.get(), path, "margin", H5T_FLOAT, 1, &shape);
    LFM2_CHECK(shape[0] == out.n_seq, path, ": margin has ", shape[0], " entries for ", out.n_seq, " sequences");
    read_all(d.get(), H5T_NATIVE_FLOAT, &out.margin, shape[0], path + ": margin");
  }
  if (h5_exists(f.get(), "all_logits")) {
    std::vector<int64_t> shape;
    H5Handle d = open_dataset(f.get(), path, "all_logits", H5T_FLOAT, 3, &shape);
    out.seq_len = shape[1];
    out.vocab = shape[2];
    read_all(d.get(), H5T_NATIVE_FLOAT, &out.all_logits, shape[0] * shape[1] * shape[2], path + ": all_logits");
  }
  return out;
}

}  // namespace lfm2
