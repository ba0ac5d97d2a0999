#include "model/weight_upload.h"

#include <algorithm>

#include <cuda_runtime_api.h>

#include "common/align.h"
#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/error.h"
#include "common/log.h"

namespace lfm2 {
namespace {

constexpr int64_t kStagingBytes = int64_t(64) << 20;  // per staging buffer; the largest piece

int64_t row_elems(const TensorSpec& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.shape.size(); ++i) n *= s.shape[i];
  return n;
}

// Rows [b, b + n) of the first dimension of an fp8 matrix (e4m3, docs/fp8.md), dequantized with its
// scales (w = q * scale in fp32, as the CPU stage's loader) and converted to `as`.
void read_dequantized(WeightReader& r, const TensorSpec& s, const std::vector<float>& scale, int64_t b, int64_t n,
                      void* out, DType as) {
  const Fp8Scheme scheme = r.config().fp8.scheme;
  const size_t nd = s.shape.size();
  const int64_t rows = s.shape[nd - 2], cols = s.shape[nd - 1], per_row = row_elems(s);
  const int64_t tr = scheme == Fp8Scheme::Channel ? 1 : kFp8Block, tc = scheme == Fp8Scheme::Channel ? cols : kFp8Block;
  const int64_t sr = fp8_scale_rows(scheme, rows), sc = fp8_scale_cols(scheme, cols);
  std::vector<float> w(size_t(n * per_row));
  r.read_rows(s, b, n, w.data(), DType::F32);
  for (int64_t i = 0; i < n * per_row / cols; ++i) {  // every matrix row of the piece
    // A stacked tensor's first-dimension row is a whole matrix; a 2-D one's is a matrix row.
    const int64_t mat = nd == 3 ? b + i / rows : 0, row = nd == 3 ? i % rows : b + i;
    const float* srow = scale.data() + (mat * sr + row / tr) * sc;
    float* wrow = w.data() + i * cols;
    for (int64_t c = 0; c < cols; ++c) wrow[c] *= srow[c / tc];
  }
  convert_elements(out, as, w.data(), DType::F32, w.size());
}

}  // namespace

WeightUploader::WeightUploader(WeightReader& reader, std::vector<TensorSpec> specs, int device)
    : reader_(reader), specs_(std::move(specs)), device_(device) {}

WeightUploader::~WeightUploader() = default;

const TensorSpec& WeightUploader::spec(const std::string& path) const {
  for (const TensorSpec& s : specs_)
    if (s.path == path) return s;
  LFM2_FAIL(reader_.path(), ": '", path, "' is not one of this stage's tensors");
}

bool WeightUploader::has(const std::string& path) const { return reader_.has(path); }

const std::vector<float>& WeightUploader::scales(const TensorSpec& matrix) {
  const TensorSpec ss = fp8_scale_spec(matrix, reader_.config().fp8.scheme);
  auto it = scales_.find(ss.path);
  if (it != scales_.end()) return it->second;
  std::vector<float> v = reader_.read_f32(ss);
  check_fp8_scales(reader_.path(), ss.path, v.data(), int64_t(v.size()));
  return scales_.emplace(ss.path, std::move(v)).first->second;
}

// A piece as stored or converted to its `as`; an fp8 scale piece (e4m3 kept on the device) is
// checked as the dequantizing path checks its scales.
void WeightUploader::read_piece(const Piece& p, void* out) {
  reader_.read_rows(*p.spec, p.row_begin, p.n_rows, out, p.as);
  if (reader_.config().fp8.on && is_fp8_scale_leaf(p.spec->path))
    check_fp8_scales(reader_.path(), p.spec->path, static_cast<const float*>(out), p.n_rows * row_elems(*p.spec),
                     p.row_begin * row_elems(*p.spec));
}

// Pieces of at most kStagingBytes, whole rows of the first dimension (a row larger than that is
// refused: no tensor of this model has one).
void WeightUploader::add_rows(const TensorSpec& s, int64_t row_begin, int64_t n_rows, DType as, int64_t offset) {
  const int64_t row_bytes = row_elems(s) * int64_t(dtype_size(as));
  LFM2_CHECK(row_bytes <= kStagingBytes, s.path, ": a row of ", row_bytes, " bytes is over the staging buffer");
  const int64_t step = std::max<int64_t>(1, kStagingBytes / std::max<int64_t>(row_bytes, 1));
  for (int64_t r = 0; r < n_rows; r += step) {
    const int64_t n = std::min(step, n_rows - r);
    pieces_.push_back({&s, nullptr, row_begin + r, n, as, offset, n * row_bytes});
    offset += n * row_bytes;
  }
}

int64_t WeightUploader::reserve(const std::vector<std::string>& paths, DType as, bool interleave) {
  std::vector<const TensorSpec*> parts;
  for (const std::string& p : paths) parts.push_back(&spec(p));
  const int64_t start = total_;
  int64_t offset = start;
  if (interleave) {
    const int64_t rows = parts[0]->shape[0];
    for (const TensorSpec* s : parts) LFM2_CHECK(s->shape[0] == rows, s->path, ": interleaved parts differ in rows");
    for (int64_t r = 0; r < rows; ++r)
      for (const TensorSpec* s : parts) {
        add_rows(*s, r, 1, as, offset);
        offset += row_elems(*s) * int64_t(dtype_size(as));
      }
  } else {
    for (const TensorSpec* s : parts) {
      add_rows(*s, 0, s->shape[0], as, offset);
      offset += s->numel() * int64_t(dtype_size(as));
    }
  }
  total_ = start + align_up(offset - start);
  return start;
}

int64_t WeightUploader::reserve_host(const std::vector<float>& data) {
  LFM2_CHECK(int64_t(data.size() * sizeof(float)) <= kStagingBytes, "weight upload: host block too large");
  const int64_t start = total_;
  pieces_.push_back({nullptr, &data, 0, 0, DType::F32, start, int64_t(data.size() * sizeof(float))});
  total_ = start + align_up(int64_t(data.size() * sizeof(float)));
  return start;
}

int64_t WeightUploader::reserve_scales_kn(const std::vector<std::string>& matrices) {
  const bool block = reader_.config().fp8.scheme == Fp8Scheme::Block128;
  std::vector<const TensorSpec*> parts;
  std::vector<const std::vector<float>*> sc;
  int64_t N = 0;  // scale rows of all the matrices: block rows (block128) or rows (channel)
  for (const std::string& p : matrices) {
    const TensorSpec& s = spec(p);
    const TensorSpec& s0 = spec(matrices[0]);
    const size_t nd = s.shape.size();
    LFM2_CHECK((nd == 3 || nd == 2) && s0.shape.size() == nd && s.shape[nd - 2] % kFp8Block == 0 &&
                   s.shape[nd - 1] % kFp8Block == 0 && (nd == 2 || s.shape[0] == s0.shape[0]) &&
                   s.shape[nd - 1] == s0.shape[nd - 1],
               s.path, ": matrices (or stacks of them) of whole 128 x 128 blocks, alike in count and columns");
    parts.push_back(&s);
    sc.push_back(&scales(s));
    N += block ? s.shape[nd - 2] / kFp8Block : s.shape[nd - 2];
  }
  const size_t nd = parts[0]->shape.size();  // a 2-D matrix is a stack of one
  const int64_t n = nd == 3 ? parts[0]->shape[0] : 1, KB = parts[0]->shape[nd - 1] / kFp8Block;
  auto out = std::make_unique<std::vector<float>>(size_t(n * KB * N));
  for (int64_t i = 0; i < n; ++i) {
    int64_t r0 = 0;  // this matrix's first scale row among the stacked ones
    for (size_t m = 0; m < parts.size(); ++m) {
      const int64_t rows = block ? parts[m]->shape[nd - 2] / kFp8Block : parts[m]->shape[nd - 2];
      const float* src = sc[m]->data() + i * rows * (block ? KB : 1);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t kb = 0; kb < KB; ++kb) (*out)[size_t((i * KB + kb) * N + r0 + r)] = src[block ? r * KB + kb : r];
      r0 += rows;
    }
  }
  host_blocks_.push_back(std::move(out));
  return reserve_host(*host_blocks_.back());
}

int64_t WeightUploader::reserve_block_scales_padded(const std::vector<std::string>& matrices, int64_t col_multiple) {
  LFM2_CHECK(reader_.config().fp8.scheme == Fp8Scheme::Block128 && col_multiple > 0 && !matrices.empty(),
             "weight upload: padded block scales of block128 matrices");
  const int64_t KB = spec(matrices[0]).shape.back() / kFp8Block;
  const int64_t KBp = (KB + col_multiple - 1) / col_multiple * col_multiple;
  auto out = std::make_unique<std::vector<float>>();
  for (const std::string& p : matrices) {
    const TensorSpec& s = spec(p);
    LFM2_CHECK(s.shape.size() == 2 && s.shape[0] % kFp8Block == 0 && s.shape[1] == KB * kFp8Block,
               s.path, ": matrices of whole 128 x 128 blocks, alike in columns");
    const std::vector<float>& sc = scales(s);
    for (int64_t r = 0; r < s.shape[0] / kFp8Block; ++r) {
      out->insert(out->end(), sc.begin() + r * KB, sc.begin() + (r + 1) * KB);
      out->insert(out->end(), size_t(KBp - KB), 0.f);
    }
  }
  host_blocks_.push_back(std::move(out));
  return reserve_host(*host_blocks_.back());
}

void WeightUploader::upload(char* base, const std::string& what) {
  CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* staging[2] = {nullptr, nullptr};
  cudaEvent_t copied[2] = {nullptr, nullptr};
  int64_t total = 0;
  for (const Piece& p : pieces_) total += p.bytes;
  // Everything is released on the way out, also when a read fails half way.
  auto release = [&] {
    cudaStreamSynchronize(stream);
    for (int i = 0; i < 2; ++i) {
      if (staging[i]) cudaFreeHost(staging[i]);
      if (copied[i]) cudaEventDestroy(copied[i]);
    }
    cudaStreamDestroy(stream);
  };
  try {
    for (int i = 0; i < 2; ++i) {
      CUDA_CHECK(cudaHostAlloc(&staging[i], size_t(kStagingBytes), cudaHostAllocDefault));
      CUDA_CHECK(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming));
    }
    const double t0 = now_s();
    Progress progress(what, double(total), total > (int64_t(1) << 30));
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const Piece& p = pieces_[i];
      const int s = int(i % 2);
      CUDA_CHECK(cudaEventSynchronize(copied[s]));  // the copy out of this buffer two pieces ago
      if (p.spec && p.spec->dtype == DType::E4M3 && p.as != DType::E4M3)
        read_dequantized(reader_, *p.spec, scales(*p.spec), p.row_begin, p.n_rows, staging[s], p.as);
      else if (p.spec)
        read_piece(p, staging[s]);
      else
        std::copy(p.host->begin(), p.host->end(), static_cast<float*>(staging[s]));
      CUDA_CHECK(cudaMemcpyAsync(base + p.offset, staging[s], size_t(p.bytes), cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaEventRecord(copied[s], stream));
      progress.advance(double(p.bytes));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    progress.finish();
    const double secs = now_s() - t0;
    if (total > (int64_t(1) << 30))
      log_info(cat(what, ": ", total >> 20, " MiB in ", int64_t(secs * 1000), " ms (",
                   int64_t(double(total) / std::max(secs, 1e-9) / 1e6), " MB/s)"));
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace lfm2
