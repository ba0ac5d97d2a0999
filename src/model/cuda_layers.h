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
// Where a norm's prompt rows feed an e4m3 product (a --dense FP8 file's qkv / conv in / w13, or the
// FP8 experts), the norm also writes their e4m3 codes and scales (rmsnorm_quantize_e4m3), which the
// product takes as they are (the bits of its own quantization; docs/fp8.md).
// run() queues kernels only: no allocation, no host synchronisation, no host read of a device
// value (the MoE's per-expert counts stay on the device), so it can be captured in a CUDA Graph.
//
// What kind of rows a pass carries chooses the kernels, never how many there are. A generation step
// (run_step: decode rows first, then prompt chunks; issues 20, 26) sends each kind through its own
// kernels inside the same blocks: decode rows through the decode products (linear*_decode), the
// flash-decoding attention and moe_decode (router, experts and combine at few rows per expert,
// the next layer's operator norm fused into the combine); prompt rows through the pinned products,
// the chunked-prefill attention and the CUTLASS experts. Both store into and read their slots'
// pages (qk_norm_rope_store) and conv state (short_conv_step). So a row's bits depend on its
// sequence and its kind alone: not on the other rows, their number, the chunking or the pages.
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

  // This stage's layers in place on x (n_seq * seq_len rows, sequence-major): scoring, no state.
  void run(float* x, int64_t n_seq, int64_t seq_len);
  // A generation step (step.rows rows, its descriptors on the device): the decode rows (the first
  // n_decode) through the decode kernels, the prompt rows through the prefill ones, each entry
  // reading and extending its slot's state.
  void run_step(float* x, const StepDevice& step);

 private:
  // What a pass carries: n_seq plain sequences of seq_len rows, or a generation step.
  struct Pass {
    int64_t n_tokens = 0, n_seq = 0, seq_len = 0;
    const StepDevice* step = nullptr;
    int64_t n_decode() const { return step ? step->n_decode : 0; }
  };
  // A product of the pass's rows: decode rows by the decode path, the others by the pinned one.
  enum class Product { kOut, kF32Out, kAddF32 };
  // A projection's weight: T (w), or e4m3 with its scales (q, s: a --dense FP8 file, cuda_weights.h).
  struct Proj {
    const T* w = nullptr;
    const uint8_t* q = nullptr;
    const float* s = nullptr;
    const float* st = nullptr;  // the scales k-block major (LFM2_FP8_PROJ_GEMM=cutlass), or null
  };
  // The prompt rows of a product's input already in e4m3 (rmsnorm_quantize_e4m3): codes (rows, n_in),
  // the scale of (row r, 128 columns g) at s[g * ld + r].
  struct QuantRows {
    const uint8_t* q = nullptr;
    const float* s = nullptr;
    int64_t ld = 0;
  };
  void product(Product kind, void* out, const T* in, Proj w, int64_t n_in, int64_t n_out, const Pass& p,
               const QuantRows& yq = {});
  QuantRows conv_quantized(size_t li, const T* bcx, const Pass& p);
  // The e4m3 projections' n prompt rows (in, out at their first): cuda::linear_fp8 (quantized, then
  // cuBLASLt's FP8 matmul). With scales k-block major (w.st, LFM2_FP8_PROJ_GEMM=cutlass) on a bf16
  // stage they run the experts' CUTLASS FP8 kernel as one group instead (bf16 out; added into the
  // residual by add through big_). The decode rows stay on the T copy (product).
  // yq.q: in's rows already quantized (linear_fp8_quantized; not on the CUTLASS path).
  void product_fp8(Product kind, void* out, const T* in, Proj w, int64_t n, int64_t n_in, int64_t n_out,
                   const QuantRows& yq);

  // This layer's operator norm as the MoE block before made it: rows [0, rows) normed into y_ (the
  // decode rows by the decode MoE's combine; every row when the prompt rows' combine made it too),
  // and the prompt rows' e4m3 codes where the mixer's product takes them (mixer_takes_e4m3).
  struct Normed {
    int64_t rows = 0;
    QuantRows q;
  };
  Normed layer_forward(size_t li, float* x, const Pass& p, const Normed& pre);
  bool mixer_takes_e4m3(size_t li) const;
  // A norm of x into y (rows [skip, n_tokens)); where its prompt rows feed an e4m3 product (feeds_e4m3)
  // and the fusion is on, also their e4m3 codes (rmsnorm_quantize_e4m3), returned (else q null);
  // then y's prompt rows are written only if prompt_t (a reader besides the product: the router).
  QuantRows norm(float* x, const float* weight, int64_t skip, bool feeds_e4m3, const Pass& p, bool prompt_t);
  void attention_block(size_t li, const T* y, float* x, const Pass& p, const QuantRows& yq);
  void attention_step_fp8(size_t li, T* qkv, T* o, const StepDevice& s);
  void conv_block(size_t li, const T* y, float* x, const Pass& p, const QuantRows& yq);
  void dense_block(const DeviceLayerWeights<T>& lw, const T* f, float* x, const Pass& p, const QuantRows& yq);
  // Returns what it made of the next layer's operator norm (the combines' fused norms).
  Normed moe_block(size_t li, const T* f, float* x, const Pass& p, const QuantRows& yq);

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
  void* proj_scratch_ = nullptr;    // cuda::linear_fp8's (N rows, the widest n_in and n_out)
  uint8_t* act_q_ = nullptr;        // in it, for the CUTLASS path: (N, max n_in) e4m3 input,
  float* act_s_ = nullptr;          // (max n_in / 128, N) its scales (moe_quantize_e4m3's layout),
  int32_t* act_offsets_ = nullptr;  // 2: the quantization's one group
  void* proj_ws_ = nullptr;         // the CUTLASS kernel's workspace (LFM2_FP8_PROJ_GEMM=cutlass)
  // The normed prompt rows in e4m3 (N, H) and their scales (H / 128, N), where the norms feed e4m3
  // products (LFM2_FP8_NORM_QUANT: 1 (default) for projections and experts, proj, moe, 0 none).
  uint8_t* norm_q_ = nullptr;
  float* norm_s_ = nullptr;
  bool fuse_proj_ = false, fuse_moe_ = false;
};

}  // namespace lfm2
