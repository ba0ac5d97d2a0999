// The layer loop of SPEC §1 on the GPU (HF Lfm2MoeDecoderLayer over the CUDA kernels), block for
// block as the CPU oracle's loop (model/cpu_layers.h: the same order and names), with every
// residual add fused into the product that makes the sublayer's output (cuBLASLt with beta = 1 into
// the fp32 residual) or into the MoE combine.
//
// Per layer (x: fp32 residual; y, big, mid: compute dtype T):
//   y = rmsnorm(x)
//   attention: big = y Wqkv^T; qk_norm_rope(big); mid = attention(big); x += mid Wo^T   linear_add_f32
//   conv:      big = y Win^T;  mid = short_conv(big);                   x += mid Wout^T linear_add_f32
//   y = rmsnorm(x)
//   dense: big = y W13^T; mid = swiglu(big); x += mid W2^T                               linear_add_f32
//   MoE:   logits = y Wg^T (fp32); route; x += experts(y) (moe_experts, the combine adds into x)
// run() queues kernels only: no allocation, no host synchronisation, no host read of a device
// value (the MoE's per-expert counts stay on the device), so it can be captured in a CUDA Graph.
//
// What kind of rows a pass carries chooses the kernels (StepRows::kind), never how many there are.
// A step that mixes prefill chunks and decode rows (issues 20, 26) describes its rows per sequence
// in StepRows and sends each kind through its own kernels inside the same blocks.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "io/model_config.h"
#include "model/cuda_decode_state.h"
#include "model/cuda_memory.h"
#include "model/cuda_weights.h"

namespace lfm2 {

template <typename T>
class CudaLayers {
 public:
  // How the layers run: plainly (scoring), storing the sequences' state (prefill, step 0), or one
  // token per sequence against it (decode, step >= 1); positions as in ops.h's "decode rows".
  struct StepRows {
    enum Kind { kPlain, kPrefill, kDecode } kind = kPlain;
    int64_t first_seq = 0, step = 0;
    const float* done = nullptr;  // decode: the finished flags (device), rows not routed to experts
    const int64_t* at = nullptr;  // decode in a graph: (first_seq, step) on the device
  };

  CudaLayers(const ModelConfig& cfg, const DeviceWeights<T>& w, const DecodeState<T>& state, cudaStream_t stream,
             bool tf32)
      : cfg_(cfg), w_(w), state_(state), stream_(stream), tf32_(tf32) {}
  CudaLayers(const CudaLayers&) = delete;
  CudaLayers& operator=(const CudaLayers&) = delete;
  ~CudaLayers() { release(); }

  // Scratch for up to max_tokens rows (y: at least y_rows, the LM head's), grown, never shrunk.
  void reserve(int64_t max_tokens, int64_t y_rows, int device);
  int64_t capacity() const { return capacity_; }
  T* y() const { return y_; }          // (max(N, y_rows), H): normed rows
  int32_t* ids() const { return ids_; }  // (N): token ids for the embedding
  void release();

  // This stage's layers in place on x (n_seq * seq_len rows, sequence-major).
  void run(float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows);

 private:
  void layer_forward(size_t li, float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows);
  void attention_block(size_t li, const T* y, float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows);
  void conv_block(size_t li, const T* y, float* x, int64_t n_seq, int64_t seq_len, const StepRows& rows);
  void dense_block(const DeviceLayerWeights<T>& lw, const T* f, float* x, int64_t n_tokens);
  void moe_block(const DeviceLayerWeights<T>& lw, const T* f, float* x, int64_t n_tokens, const float* done);

  const ModelConfig& cfg_;
  const DeviceWeights<T>& w_;
  const DecodeState<T>& state_;
  cudaStream_t stream_;
  bool tf32_;
  // Scratch, one allocation, reused by every layer.
  DeviceBlocks scratch_;
  int64_t capacity_ = 0;
  T *y_ = nullptr, *big_ = nullptr, *mid_ = nullptr;
  float *router_logits_ = nullptr, *topk_w_ = nullptr;
  int32_t *topk_ids_ = nullptr, *ids_ = nullptr;
  void* moe_scratch_ = nullptr;
};

}  // namespace lfm2
