// Thin HDF5 C-API helpers: the H5_CHECK macro, owning handles, the fp16/bf16 file types and
// string/scalar attributes. HDF5's own error printing is switched off; errors become lfm2::Error
// with the innermost message of HDF5's error stack.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"

namespace lfm2 {

// The innermost description on HDF5's error stack (e.g. "file signature not found"), then clears it;
// on one line, an OS error reduced to its action and cause ("file write failed: No space left on
// device").
std::string h5_error_message();  // (H5_CHECK, common/error.h)
// One HDF5 error description on one line (what h5_error_message() does to it).
std::string h5_one_line(const std::string& desc);

// Call first in main(), before any other HDF5 call: HDF5 then registers no exit handler. A file whose
// close failed (a full disk) stays in HDF5's table, and the handler's second attempt to close it at
// exit faults (SIGSEGV after the one-line error). Programs close their files themselves; the
// operating system releases what an error left open.
void h5_no_exit_handlers();

// Silences HDF5's automatic error printing in the calling thread (idempotent; call it in every
// thread that makes HDF5 calls).
void h5_quiet();


// Owns one hid_t and closes it with the matching H5?close.
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept;
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Gives up ownership without closing (the caller closes, e.g. to check H5Fclose's result).
  hid_t release() {
    hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_ = -1;
};

// File (on-disk) datatype for a dtype: IEEE f32 LE, or a 16-bit custom float (fp16: 1-5-10, bf16:
// 1-8-7) that HDF5 and h5py convert to float on read; e4m3: uint8 bits (FP8 weights). Caller owns
// the returned handle.
H5Handle h5_file_type(DType t);
// The dtype of a dataset's file type; throws for anything that is not one of the four.
DType h5_dtype_of(hid_t type, const std::string& where);

// Attributes on a file, group or dataset.
void h5_write_attr(hid_t obj, const std::string& name, const std::string& value);
void h5_write_attr(hid_t obj, const std::string& name, int64_t value);
void h5_write_attr(hid_t obj, const std::string& name, double value);
bool h5_has_attr(hid_t obj, const std::string& name);
std::string h5_read_attr_string(hid_t obj, const std::string& name, const std::string& where);
int64_t h5_read_attr_int(hid_t obj, const std::string& name, const std::string& where);

// Creates every missing group on the way to `path` ("a/b/c" creates a and a/b).
void h5_make_parents(hid_t file, const std::string& path);
bool h5_exists(hid_t file, const std::string& path);
std::vector<int64_t> h5_dataset_shape(hid_t dset);

}  // namespace lfm2
