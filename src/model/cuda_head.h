// The LM head on the GPU (last stage): the final norm and the head matrix over kRows rows at a
// time, into one of two fp32 logits slots (one is copied to the host while the next rows are
// computed into the other, each reused once its copy is done), and the top-1 with its margin.
// head() (HeadOutputs) runs here; generation's token choice takes its logits from last_logits().
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "io/model_config.h"
#include "model/cuda_memory.h"
#include "model/cuda_weights.h"
#include "model/stage_executor.h"

namespace lfm2 {

template <typename T>
class CudaHead {
 public:
  static constexpr int64_t kRows = 256;  // LM-head rows per GEMM (bounds the logits buffers)

  CudaHead() = default;
  CudaHead(const CudaHead&) = delete;
  CudaHead& operator=(const CudaHead&) = delete;
  ~CudaHead() { release(); }

  // The weights it reads (embedding_norm, head_matrix()); allocate() once before the first use.
  void init(const ModelConfig& cfg, const DeviceWeights<T>& w, bool tf32);
  void allocate(int device);
  void release();

  // StageExecutor::head() of n_seq sequences of seq_len rows of x; lengths (host, pinned) or null.
  // y: scratch of at least kRows rows. Results on `stream`, logits to the host on `copy`.
  void run(T* y, const float* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out,
           cudaStream_t stream, cudaStream_t copy);
  // The next slot, filled with the logits (rows, V) of the last position of `rows` sequences of x
  // (seq_len rows each): row lengths[s] - 1 (device), or seq_len - 1 where lengths is null; with
  // seq_len 0, row lengths[s] - 1 of x itself. Generation's token choice: the head's product by the
  // decode path (linear_f32out_decode: a row's bits depend on the shape alone).
  float* last_logits(T* y, const float* x, int64_t rows, int64_t seq_len, const int32_t* lengths,
                     cudaStream_t stream);

  int32_t* top() const { return top_; }       // (kRows)
  float* margin() const { return margin_; }   // (kRows)

 private:
  // The next slot for `stream` to compute logits into, once the copy out of it (if any) is done.
  float* take_slot(cudaStream_t stream);
  // Copies the current slot's first n floats to host memory on `copy`, after `compute` wrote them.
  void copy_out(float* host, int64_t n, cudaStream_t compute, cudaStream_t copy);
  void last_rows(float* logits, T* y, const float* x, int64_t rows, int64_t seq_len, const int32_t* lengths,
                 cudaStream_t stream, bool decode);

  int64_t H_ = 0, V_ = 0;
  float eps_ = 0;
  bool tf32_ = false;
  const float* norm_ = nullptr;  // (H) embedding_norm
  const T* matrix_ = nullptr;    // (V, H)

  DeviceBlocks memory_;
  float* slot_[2] = {nullptr, nullptr};  // (kRows, V) logits
  int32_t* top_ = nullptr;               // (kRows)
  float* margin_ = nullptr;              // (kRows)
  int32_t* lengths_ = nullptr;           // (kRows) the rows' sequence lengths
  cudaEvent_t computed_[2] = {nullptr, nullptr}, copied_[2] = {nullptr, nullptr};
  bool copying_[2] = {false, false};
  int cur_ = 0, next_ = 0;
};

}  // namespace lfm2
