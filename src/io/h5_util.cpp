#include "io/h5_util.h"

#include <mutex>

namespace lfm2 {

namespace {
herr_t take_innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0) *static_cast<std::string*>(out) = err->desc ? err->desc : "";
  return 0;
}
}  // namespace

std::string h5_error_message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "HDF5 error" : h5_one_line(msg);
}

std::string h5_one_line(const std::string& desc) {
  // The file drivers describe an OS error as "file write failed: time = <ctime with its newline>,
  // filename = ..., errno = 28, error message = 'No space left on device', buf = ...": keep the
  // action and the cause.
  const std::string key = "error message = '";
  const size_t at = desc.find(key);
  if (at != std::string::npos) {
    const size_t from = at + key.size(), end = desc.find('\'', from);
    const std::string cause = desc.substr(from, end == std::string::npos ? std::string::npos : end - from);
    const size_t colon = desc.find(':');
    return (colon != std::string::npos && colon < at ? desc.substr(0, colon) + ": " : std::string()) + cause;
  }
  std::string one;
  for (char c : desc) {
    const bool space = c == '\n' || c == '\r' || c == '\t';
    if (space && (one.empty() || one.back() == ' ')) continue;
    one += space ? ' ' : c;
  }
  while (!one.empty() && one.back() == ' ') one.pop_back();
  return one;
}

void h5_no_exit_handlers() { H5dont_atexit(); }

void h5_quiet() {
  // Per thread: a thread-safe HDF5 build keeps one error stack (and its printing) per thread.
  thread_local bool done = false;
  if (!done) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  done = true;
}

H5Handle& H5Handle::operator=(H5Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = -1;
  }
  return *this;
}

void H5Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = -1;
}

H5Handle h5_file_type(DType t) {
  if (t == DType::F32) return H5Handle(H5Tcopy(H5T_IEEE_F32LE));
  // e4m3fn's largest exponent holds numbers (256..448), not inf/NaN as an HDF5 float's would, so
  // HDF5 could not convert it: the raw bits as unsigned bytes (docs/weight-format.md).
  if (t == DType::E4M3) return H5Handle(H5Tcopy(H5T_STD_U8LE));
  H5Handle type(H5Tcopy(H5T_IEEE_F32LE));
  // Fields first (they fit in 32 bits), then shrink to 2 bytes, as h5py builds its float16.
  if (t == DType::F16) {
    H5_CHECK(H5Tset_fields(type.get(), 15, 10, 5, 0, 10), "fp16 type");
    H5_CHECK(H5Tset_size(type.get(), 2), "fp16 type");
    H5_CHECK(H5Tset_ebias(type.get(), 15), "fp16 type");
  } else {
    H5_CHECK(H5Tset_fields(type.get(), 15, 7, 8, 0, 7), "bf16 type");
    H5_CHECK(H5Tset_size(type.get(), 2), "bf16 type");
    H5_CHECK(H5Tset_ebias(type.get(), 127), "bf16 type");
  }
  return type;
}

DType h5_dtype_of(hid_t type, const std::string& where) {
  if (H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 1 && H5Tget_sign(type) == H5T_SGN_NONE)
    return DType::E4M3;
  LFM2_CHECK(H5Tget_class(type) == H5T_FLOAT, where, ": dataset is not a float dataset");
  LFM2_CHECK(H5Tget_order(type) == H5T_ORDER_LE, where, ": dataset is not little-endian");
  size_t spos, epos, esize, mpos, msize;
  H5_CHECK(H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize), where);
  size_t size = H5Tget_size(type);
  if (size == 4 && esize == 8 && msize == 23) return DType::F32;
  if (size == 2 && spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10) return DType::F16;
  if (size == 2 && spos == 15 && epos == 7 && esize == 8 && mpos == 0 && msize == 7) return DType::BF16;
  throw Error(cat(where, ": unsupported float type (", size, " bytes, exponent ", esize, " bits, mantissa ",
                  msize, " bits)"));
}

void h5_write_attr(hid_t obj, const std::string& name, const std::string& value) {
  H5Handle type(H5Tcopy(H5T_C_S1));
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE), "attribute ", name);
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8), "attribute ", name);
  H5Handle space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Handle attr(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(attr.get(), "creating attribute ", name);
  const char* p = value.c_str();
  H5_CHECK(H5Awrite(attr.get(), type.get(), &p), "writing attribute ", name);
}

namespace {
void write_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const void* v) {
  H5Handle space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Handle attr(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(attr.get(), "creating attribute ", name);
  H5_CHECK(H5Awrite(attr.get(), mem_type, v), "writing attribute ", name);
}
}  // namespace

void h5_write_attr(hid_t obj, const std::string& name, int64_t value) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void h5_write_attr(hid_t obj, const std::string& name, double value) {
  write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

bool h5_has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string h5_read_attr_string(hid_t obj, const std::string& name, const std::string& where) {
  LFM2_CHECK(h5_has_attr(obj, name), where, ": missing attribute '", name, "'");
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  H5_CHECK(attr.get(), where, ": opening attribute ", name);
  H5Handle type(H5Aget_type(attr.get()));
  LFM2_CHECK(H5Tget_class(type.get()) == H5T_STRING, where, ": attribute '", name, "' is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Handle mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* p = nullptr;
    H5_CHECK(H5Aread(attr.get(), mem.get(), &p), where, ": reading attribute ", name);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  H5_CHECK(H5Aread(attr.get(), type.get(), s.data()), where, ": reading attribute ", name);
  s.resize(s.find_last_not_of('\0') + 1);
  return s;
}

int64_t h5_read_attr_int(hid_t obj, const std::string& name, const std::string& where) {
  LFM2_CHECK(h5_has_attr(obj, name), where, ": missing attribute '", name, "'");
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  H5_CHECK(attr.get(), where, ": opening attribute ", name);
  int64_t v = 0;
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), where, ": reading attribute ", name);
  return v;
}

bool h5_exists(hid_t file, const std::string& path) {
  // Walk component by component: H5Lexists fails on a missing intermediate group.
  size_t pos = 0;
  while (true) {
    size_t next = path.find('/', pos);
    std::string prefix = path.substr(0, next);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

void h5_make_parents(hid_t file, const std::string& path) {
  size_t pos = 0;
  while ((pos = path.find('/', pos)) != std::string::npos) {
    std::string group = path.substr(0, pos++);
    if (H5Lexists(file, group.c_str(), H5P_DEFAULT) > 0) continue;
    H5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE));
    H5_CHECK(H5Pset_obj_track_times(gcpl.get(), 0), "creating group ", group);  // reproducible files
    H5Handle g(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
    H5_CHECK(g.get(), "creating group ", group);
  }
}

std::vector<int64_t> h5_dataset_shape(hid_t dset) {
  H5Handle space(H5Dget_space(dset));
  H5_CHECK(space.get(), "dataset space");
  int rank = H5Sget_simple_extent_ndims(space.get());
  H5_CHECK(rank, "dataset rank");
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

}  // namespace lfm2
