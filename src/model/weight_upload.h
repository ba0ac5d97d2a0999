// Streams a stage's tensors from its weight file into one device allocation.
//
// Blocks are planned first (reserve: where each lands, 256-byte aligned), then upload() reads each
// tensor in its stored dtype (converted on the host only where the file's dtype is not the one
// asked for) in pieces of at most 64 MiB into one of two pinned staging buffers, and copies each
// piece to the device asynchronously while the next one is read: the disk (or page cache) and the
// PCIe copy overlap, and no fp32 copy of a 16-bit model is ever made on the host. Reports progress
// and the rate it reached. An fp8 file's e4m3 matrices are copied as stored where reserved as E4M3
// (a 16-bit stage's experts; their scales checked as they pass), else dequantized on the host
// (w = q * scale, then rounded to the dtype asked for; the scales read, checked, kept per matrix).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "io/weight_file.h"

namespace lfm2 {

class WeightUploader {
 public:
  // `specs`: the tensors the stage may read (stage_tensor_specs), checked against the file.
  WeightUploader(WeightReader& reader, std::vector<TensorSpec> specs, int device);
  ~WeightUploader();
  WeightUploader(const WeightUploader&) = delete;
  WeightUploader& operator=(const WeightUploader&) = delete;

  // A block of the given datasets as `as`, one after the other; with interleave, row by row of
  // their first dimension instead (expert e's w1 rows, then its w3 rows, then expert e+1's...).
  // Returns its byte offset in the allocation.
  int64_t reserve(const std::vector<std::string>& paths, DType as, bool interleave = false);
  int64_t reserve(const std::string& path, DType as) { return reserve(std::vector<std::string>{path}, as); }
  // A block of host data (fp32), copied as it is.
  int64_t reserve_host(const std::vector<float>& data);
  // The scales of stacked fp8 matrices (n, rows_i, cols) (or 2-D (rows_i, cols): n = 1), rows_i and
  // cols multiples of 128, as the
  // FP8 grouped GEMM reads them (kernels/cuda/grouped_gemm_fp8.h): for each of the n, k-block major,
  // the matrices' rows stacked (as reserve's interleave stacks them). block128: the (rows_i / 128,
  // cols / 128) block scales transposed to (cols / 128, sum rows_i / 128); channel: each row's
  // scale repeated for every 128 columns, (cols / 128, sum rows_i). fp32.
  int64_t reserve_scales_kn(const std::vector<std::string>& matrices);
  // The 128 x 128 block scales of 2-D block128 fp8 matrices (rows_i, cols), rows_i and cols
  // multiples of 128, as cuBLASLt's BLK128x128 scales read them (kernels/cuda/linear_fp8_lt.h): the
  // matrices' (rows_i / 128, cols / 128) stacked, each row of cols / 128 k blocks padded with zeros
  // to a multiple of col_multiple. fp32.
  int64_t reserve_block_scales_padded(const std::vector<std::string>& matrices, int64_t col_multiple);
  bool has(const std::string& path) const;

  int64_t total_bytes() const { return total_; }
  // Reads and copies every reserved block to base + its offset; returns when all have landed.
  void upload(char* base, const std::string& what);

 private:
  struct Piece {
    const TensorSpec* spec;      // null: host data
    const std::vector<float>* host;
    int64_t row_begin, n_rows;   // of the first dimension
    DType as;
    int64_t offset, bytes;       // destination
  };
  const TensorSpec& spec(const std::string& path) const;
  void add_rows(const TensorSpec& s, int64_t row_begin, int64_t n_rows, DType as, int64_t offset);
  const std::vector<float>& scales(const TensorSpec& matrix);  // an fp8 matrix's, read once, checked
  void read_piece(const Piece& p, void* out);

  WeightReader& reader_;
  std::vector<TensorSpec> specs_;
  int device_;
  std::vector<Piece> pieces_;
  int64_t total_ = 0;
  std::map<std::string, std::vector<float>> scales_;  // scale dataset path -> its values
  std::vector<std::unique_ptr<std::vector<float>>> host_blocks_;  // made here, until the upload
};

}  // namespace lfm2
