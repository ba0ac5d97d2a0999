#include "model/cuda_head.h"

#include <algorithm>

#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace lfm2 {

template <typename T>
void CudaHead<T>::init(const ModelConfig& cfg, const DeviceWeights<T>& w, bool tf32) {
  H_ = cfg.hidden_size;
  V_ = cfg.vocab_size;
  eps_ = float(cfg.norm_eps);
  tf32_ = tf32;
  norm_ = w.embedding_norm;
  matrix_ = w.head_matrix();
}

template <typename T>
void CudaHead<T>::allocate(int device) {
  if (memory_.allocated()) return;
  const int64_t slot0 = memory_.reserve(kRows * V_ * 4), slot1 = memory_.reserve(kRows * V_ * 4);
  const int64_t top = memory_.reserve(kRows * 4), margin = memory_.reserve(kRows * 4);
  const int64_t lengths = memory_.reserve(kRows * 4);
  memory_.allocate("the LM head's logits", device);
  slot_[0] = memory_.at<float>(slot0);
  slot_[1] = memory_.at<float>(slot1);
  top_ = memory_.at<int32_t>(top);
  margin_ = memory_.at<float>(margin);
  lengths_ = memory_.at<int32_t>(lengths);
  for (int i = 0; i < 2; ++i) {
    CUDA_CHECK(cudaEventCreateWithFlags(&computed_[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
  }
}

template <typename T>
void CudaHead<T>::release() {
  for (int i = 0; i < 2; ++i) {
    if (computed_[i]) cudaEventDestroy(computed_[i]);
    if (copied_[i]) cudaEventDestroy(copied_[i]);
    computed_[i] = copied_[i] = nullptr;
  }
  memory_.release();
}

template <typename T>
float* CudaHead<T>::take_slot(cudaStream_t stream) {
  cur_ = next_;
  next_ = 1 - next_;
  if (copying_[cur_]) CUDA_CHECK(cudaStreamWaitEvent(stream, copied_[cur_], 0));
  copying_[cur_] = false;
  return slot_[cur_];
}

template <typename T>
void CudaHead<T>::copy_out(float* host, int64_t n, cudaStream_t compute, cudaStream_t copy) {
  CUDA_CHECK(cudaEventRecord(computed_[cur_], compute));
  CUDA_CHECK(cudaStreamWaitEvent(copy, computed_[cur_], 0));
  CUDA_CHECK(cudaMemcpyAsync(host, slot_[cur_], size_t(n) * sizeof(float), cudaMemcpyDeviceToHost, copy));
  CUDA_CHECK(cudaEventRecord(copied_[cur_], copy));
  copying_[cur_] = true;
}

template <typename T>
void CudaHead<T>::last_rows(float* logits, T* y, const float* x, int64_t rows, int64_t seq_len,
                            const int32_t* lengths, cudaStream_t stream, bool decode) {
  cuda::rmsnorm_last(y, x, norm_, rows, seq_len, H_, eps_, stream, lengths);
  if (decode)
    cuda::linear_f32out_decode(logits, y, matrix_, rows, H_, V_, stream, tf32_);
  else
    cuda::linear_f32out(logits, y, matrix_, rows, H_, V_, stream, tf32_);
}

template <typename T>
float* CudaHead<T>::last_logits(T* y, const float* x, int64_t rows, int64_t seq_len, const int32_t* lengths,
                                cudaStream_t stream) {
  float* logits = take_slot(stream);
  last_rows(logits, y, x, rows, seq_len, lengths, stream, true);
  return logits;
}

// Last positions: norm, LM head (fp32 logits), top-1 and margin on the device; the two small
// results follow on the compute stream, the logits (where asked) on the copy stream while the next
// rows are computed. Then, where asked, the logits of every position.
template <typename T>
void CudaHead<T>::run(T* y, const float* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths,
                      const HeadOutputs& out, cudaStream_t stream, cudaStream_t copy) {
  auto to_host = [&](void* host, const void* dev, int64_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(host, dev, size_t(bytes), cudaMemcpyDeviceToHost, stream));
  };
  for (int64_t r0 = 0; r0 < n_seq; r0 += kRows) {
    const int64_t rows = std::min(kRows, n_seq - r0);
    float* logits = take_slot(stream);
    if (lengths)  // each sequence's own last position (pinned host memory, read when the copy runs)
      CUDA_CHECK(cudaMemcpyAsync(lengths_, lengths + r0, size_t(rows) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream));
    last_rows(logits, y, x + r0 * seq_len * H_, rows, seq_len, lengths ? lengths_ : nullptr, stream, false);
    cuda::argmax_margin(top_, margin_, logits, rows, V_, stream);
    if (out.next_token) to_host(out.next_token + r0, top_, rows * int64_t(sizeof(int32_t)));
    if (out.margin) to_host(out.margin + r0, margin_, rows * int64_t(sizeof(float)));
    if (out.logits) copy_out(out.logits + r0 * V_, rows * V_, stream, copy);
  }
  if (!out.all_logits) return;
  for (int64_t r0 = 0; r0 < n_seq * seq_len; r0 += kRows) {
    const int64_t rows = std::min(kRows, n_seq * seq_len - r0);
    float* logits = take_slot(stream);
    cuda::rmsnorm(y, x + r0 * H_, norm_, rows, H_, eps_, stream);
    cuda::linear_f32out(logits, y, matrix_, rows, H_, V_, stream, tf32_);
    copy_out(out.all_logits + r0 * V_, rows * V_, stream, copy);
  }
}

template class CudaHead<float>;
template class CudaHead<__nv_bfloat16>;
template class CudaHead<__half>;

}  // namespace lfm2
