// The CUDA StageExecutor (see cuda_stage.h): the layer loop of SPEC §1 over the CUDA kernels, with
// every residual add fused into the product that produces the sublayer's output (cuBLASLt with
// beta = 1 into the fp32 residual) or into the MoE combine.
//
// Per layer (x: fp32 residual; y, big, mid: compute dtype T):
//   y = rmsnorm(x)
//   attention: big = y Wqkv^T; qk_norm_rope(big); mid = attention(big); x += mid Wo^T   linear_add_f32
//   conv:      big = y Win^T;  mid = short_conv(big);                   x += mid Wout^T linear_add_f32
//   y = rmsnorm(x)
//   dense: big = y W13^T; mid = swiglu(big); x += mid W2^T                               linear_add_f32
//   MoE:   logits = y Wg^T (fp32); route; x += experts(y) (moe_experts, the combine adds into x)
// forward() queues kernels only: no allocation, no host synchronisation, no host read of a
// device value (the MoE's per-expert counts stay on the device), so it can be captured in a graph.
// A generation decode step is too: its kernels read the microbatch's first sequence and the step
// from the device (decode_at_), so one graph per buffer and microbatch size replays every step.
#include "model/cuda_stage.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/ops.h"
#include "kernels/rope.h"
#include "kernels/sample.h"
#include "io/weight_names.h"
#include "model/weight_upload.h"

namespace lfm2 {
namespace {

constexpr int64_t kAlign = 256;
constexpr int64_t kHeadRows = 256;  // LM-head rows per GEMM chunk (bounds the logits buffer)

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// cudaMalloc that names what it was allocating and the free memory when it fails.
void* device_alloc(int64_t bytes, const std::string& what, int device) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 1)));
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    LFM2_FAIL("out of GPU memory allocating ", what, " (", bytes >> 20, " MiB) on device ", device, ": ",
              free_b >> 20, " MiB free of ", total_b >> 20, " MiB (", cudaGetErrorString(err), ")");
  }
  return p;
}

template <typename T>
DType dtype_of();
template <>
DType dtype_of<float>() { return DType::F32; }
template <>
DType dtype_of<__nv_bfloat16>() { return DType::BF16; }
template <>
DType dtype_of<__half>() { return DType::F16; }

// Device pointers of one layer's weights (null where the layer kind has none).
template <typename T>
struct DevLayer {
  bool is_attention = false, is_moe = false;
  const float *operator_norm = nullptr, *ffn_norm = nullptr;
  const T* wqkv = nullptr;       // ((nh + 2 nkv) hd, H): q_proj; k_proj; v_proj
  const float *q_norm = nullptr, *k_norm = nullptr;  // (hd)
  const T* attn_out = nullptr;   // (H, nh hd)
  const float* conv_w = nullptr; // (H, L)
  const T* conv_in = nullptr;    // (3H, H)
  const T* conv_out = nullptr;   // (H, H)
  const T* w13 = nullptr;        // dense (2I, H): w1; w3    MoE (E, 2Im, H): per expert w1; w3
  const T* w2 = nullptr;         // dense (H, I)              MoE (E, H, Im)
  const T* gate = nullptr;       // (E, H)
  const float* expert_bias = nullptr;  // (E) or null
};

// Places host tensors into one device allocation: plan() reserves, then upload() converts and
// copies each one to the offset it reserved.
class WeightArena {
 public:
  int64_t reserve(int64_t bytes) {
    const int64_t off = total_;
    total_ += align_up(bytes);
    return off;
  }
  int64_t total() const { return total_; }
  void allocate(int device) { base_ = static_cast<char*>(device_alloc(total_, "the stage's weights", device)); }
  char* base() const { return base_; }
  void release() {
    if (base_) cudaFree(base_);
    base_ = nullptr;
  }

 private:
  int64_t total_ = 0;
  char* base_ = nullptr;
};

// The LM head's device buffers: two logits slots of kHeadRows rows (one is copied to the host
// while the next rows are computed into the other) and the top-1 / margin of one slot's rows.
class HeadBuffers {
 public:
  int32_t* top = nullptr;      // (kHeadRows)
  float* margin = nullptr;     // (kHeadRows)
  int32_t* lengths = nullptr;  // (kHeadRows) the rows' sequence lengths

  void allocate(int64_t vocab, int device) {
    if (base_) return;
    slot_floats_ = kHeadRows * vocab;
    const int64_t bytes = 2 * align_up(slot_floats_ * 4) + 3 * align_up(kHeadRows * 4);
    base_ = static_cast<char*>(device_alloc(bytes, "the LM head's logits", device));
    top = reinterpret_cast<int32_t*>(base_ + 2 * align_up(slot_floats_ * 4));
    margin = reinterpret_cast<float*>(base_ + 2 * align_up(slot_floats_ * 4) + align_up(kHeadRows * 4));
    lengths = reinterpret_cast<int32_t*>(base_ + 2 * align_up(slot_floats_ * 4) + 2 * align_up(kHeadRows * 4));
    for (int i = 0; i < 2; ++i) {
      CUDA_CHECK(cudaEventCreateWithFlags(&computed_[i], cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
    }
  }

  void release() {
    for (int i = 0; i < 2; ++i) {
      if (computed_[i]) cudaEventDestroy(computed_[i]);
      if (copied_[i]) cudaEventDestroy(copied_[i]);
      computed_[i] = copied_[i] = nullptr;
    }
    if (base_) cudaFree(base_);
    base_ = nullptr;
  }

  // The next slot for `stream` to compute logits into, once the copy out of it (if any) is done.
  float* take_slot(cudaStream_t stream) {
    cur_ = next_;
    next_ = 1 - next_;
    if (copying_[cur_]) CUDA_CHECK(cudaStreamWaitEvent(stream, copied_[cur_], 0));
    copying_[cur_] = false;
    return reinterpret_cast<float*>(base_ + cur_ * align_up(slot_floats_ * 4));
  }

  // Copies the current slot's first n floats to host memory on `copy`, after `compute` wrote them.
  void copy_out(float* host, int64_t n, cudaStream_t compute, cudaStream_t copy) {
    CUDA_CHECK(cudaEventRecord(computed_[cur_], compute));
    CUDA_CHECK(cudaStreamWaitEvent(copy, computed_[cur_], 0));
    CUDA_CHECK(cudaMemcpyAsync(host, base_ + cur_ * align_up(slot_floats_ * 4), size_t(n) * sizeof(float),
                               cudaMemcpyDeviceToHost, copy));
    CUDA_CHECK(cudaEventRecord(copied_[cur_], copy));
    copying_[cur_] = true;
  }

 private:
  char* base_ = nullptr;
  int64_t slot_floats_ = 0;
  cudaEvent_t computed_[2] = {nullptr, nullptr}, copied_[2] = {nullptr, nullptr};
  bool copying_[2] = {false, false};
  int cur_ = 0, next_ = 0;
};

template <typename T>
class CudaStage final : public CudaStageExecutor {
 public:
  CudaStage(WeightReader& reader, const StageRange& range, int device, bool tf32, bool graphs)
      : cfg_(reader.config()), range_(range), device_(device), tf32_(tf32),
        graphs_on_(graphs && !cuda_sync_check_enabled()) {
    int n_dev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n_dev));
    LFM2_CHECK(device >= 0 && device < n_dev, "cuda stage: device ", device, " does not exist (", n_dev,
               " visible)");
    CUDA_CHECK(cudaSetDevice(device_));
    if (!std::is_same<T, float>::value) check_sixteen_bit_shapes();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&nonfinite_, sizeof(unsigned int)));
    CUDA_CHECK(cudaMalloc(&decode_at_, 2 * sizeof(int64_t)));
    cuda::cublas_prepare();
    upload_weights(reader);
  }

  ~CudaStage() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (d2h_stream_) cudaStreamSynchronize(d2h_stream_);
    for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
    for (void* p : hidden_) cudaFree(p);
    for (void* p : token_bufs_) cudaFree(p);
    free_state();
    for (void* p : host_) cudaFreeHost(p);
    cudaFree(nonfinite_);
    cudaFree(decode_at_);
    head_.release();
    free_scratch();
    arena_.release();
    for (cudaStream_t s : {stream_, d2h_stream_})
      if (s) cudaStreamDestroy(s);
  }

  DType act_dtype() const override { return DType::F32; }
  bool on_device() const override { return true; }
  int64_t weight_bytes() const override { return arena_.total(); }
  int device() const override { return device_; }
  CUstream_st* stream() const override { return stream_; }
  DType compute_dtype() const override { return dtype_of<T>(); }
  void wait_event(CUevent_st* event) override { CUDA_CHECK(cudaStreamWaitEvent(stream_, event, 0)); }
  void record_event(CUevent_st* event) override { CUDA_CHECK(cudaEventRecord(event, stream_)); }

  void* alloc_hidden(int64_t max_tokens) override {
    LFM2_CHECK(max_tokens > 0, "cuda stage: alloc_hidden(", max_tokens, ")");
    CUDA_CHECK(cudaSetDevice(device_));
    ensure_scratch(max_tokens);
    if (range_.is_last) head_.allocate(cfg_.vocab_size, device_);
    hidden_.push_back(device_alloc(max_tokens * cfg_.hidden_size * int64_t(sizeof(float)),
                                   cat("a hidden-state buffer of ", max_tokens, " tokens"), device_));
    return hidden_.back();
  }

  void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) override {
    LFM2_CHECK(range_.is_first, "cuda stage: embed() on a stage that is not first");
    const int64_t n = n_seq * seq_len;
    check_capacity(n, "embed");
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemcpyAsync(ids_, ids, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    cuda::embedding(static_cast<float*>(x), ids_, embed_, n, cfg_.vocab_size, cfg_.hidden_size, stream_);
  }

  // One device counter serves every check: zeroed, counted and copied out in stream order.
  bool count_nonfinite(const void* buf, int64_t n, uint32_t* count) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemsetAsync(nonfinite_, 0, sizeof(unsigned int), stream_));
    cuda::count_nonfinite(nonfinite_, static_cast<const float*>(buf), n, stream_);
    CUDA_CHECK(cudaMemcpyAsync(count, nonfinite_, sizeof(unsigned int), cudaMemcpyDeviceToHost, stream_));
    return true;
  }

  void* alloc_host(int64_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, size_t(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      LFM2_FAIL("cannot allocate ", bytes >> 20, " MiB of pinned host memory for device ", device_, ": ",
                cudaGetErrorString(err));
    }
    host_.push_back(p);
    return p;
  }

  // The layers, replayed from a CUDA Graph captured once per (buffer, shape): one launch instead of
  // ~15 per layer. Capture needs nothing but the stream (no allocation, no synchronisation).
  void forward(void* xv, int64_t n_seq, int64_t seq_len) override {
    check_capacity(n_seq * seq_len, "forward");
    CUDA_CHECK(cudaSetDevice(device_));
    float* x = static_cast<float*>(xv);
    if (!graphs_on_) return layers(x, n_seq, seq_len);
    replay(GraphKey{xv, n_seq, seq_len, false}, [&] { layers(x, n_seq, seq_len); });
  }

  // Last positions: norm, LM head (fp32 logits, kHeadRows rows at a time), top-1 and margin on the
  // device; the two small results follow on the compute stream, the logits (where asked) on a copy
  // stream while the next rows are computed (two logits slots, each reused once its copy is done).
  void head(const void* xv, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) override {
    LFM2_CHECK(range_.is_last, "cuda stage: head() on a stage that is not last");
    check_capacity(n_seq * seq_len, "head");
    CUDA_CHECK(cudaSetDevice(device_));
    const float* x = static_cast<const float*>(xv);
    const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    const float eps = float(cfg_.norm_eps);
    for (int64_t r0 = 0; r0 < n_seq; r0 += kHeadRows) {
      const int64_t rows = std::min(kHeadRows, n_seq - r0);
      float* logits = head_.take_slot(stream_);
      if (lengths)  // each sequence's own last position (pinned host memory, read when the copy runs)
        CUDA_CHECK(cudaMemcpyAsync(head_.lengths, lengths + r0, size_t(rows) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   stream_));
      cuda::rmsnorm_last(y_, x + r0 * seq_len * H, final_norm_, rows, seq_len, H, eps, stream_,
                         lengths ? head_.lengths : nullptr);
      cuda::linear_f32out(logits, y_, head_w_, rows, H, V, stream_, tf32_);
      cuda::argmax_margin(head_.top, head_.margin, logits, rows, V, stream_);
      if (out.next_token) copy_to_host(out.next_token + r0, head_.top, rows * int64_t(sizeof(int32_t)));
      if (out.margin) copy_to_host(out.margin + r0, head_.margin, rows * int64_t(sizeof(float)));
      if (out.logits) head_.copy_out(out.logits + r0 * V, rows * V, stream_, d2h_stream_);
    }
    if (!out.all_logits) return;
    for (int64_t r0 = 0; r0 < n_seq * seq_len; r0 += kHeadRows) {
      const int64_t rows = std::min(kHeadRows, n_seq * seq_len - r0);
      float* logits = head_.take_slot(stream_);
      cuda::rmsnorm(y_, x + r0 * H, final_norm_, rows, H, eps, stream_);
      cuda::linear_f32out(logits, y_, head_w_, rows, H, V, stream_, tf32_);
      head_.copy_out(out.all_logits + r0 * V, rows * V, stream_, d2h_stream_);
    }
  }

  void synchronize() override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaStreamSynchronize(d2h_stream_));
  }

  // ---- generation: the KV cache (compute dtype) and conv state (fp32) of this stage's layers
  int64_t state_bytes(int64_t n_seq, int64_t max_len) const override {
    const int64_t kv = cfg_.num_key_value_heads * cfg_.head_dim(), L = cfg_.conv_L_cache, H = cfg_.hidden_size;
    int64_t bytes = 0;
    for (const DevLayer<T>& d : layers_)
      bytes += d.is_attention ? align_up(n_seq * max_len * kv * int64_t(sizeof(T))) * 2
                              : align_up(n_seq * (L - 1) * H * int64_t(sizeof(float)));
    return bytes + 2 * align_up(n_seq * 4) + align_up(64 * 4);
  }

  void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& sampling) override {
    CUDA_CHECK(cudaSetDevice(device_));
    LFM2_CHECK(int64_t(sampling.eos.size()) <= 64, "cuda stage: at most 64 end-of-sequence ids");
    free_state();
    const int64_t kv = cfg_.num_key_value_heads * cfg_.head_dim(), L = cfg_.conv_L_cache, H = cfg_.hidden_size;
    state_.base = static_cast<char*>(device_alloc(state_bytes(n_seq, max_len),
                                                  cat("the generation state (KV cache and conv state) of ", n_seq,
                                                      " sequences x ", max_len, " positions"),
                                                  device_));
    char* p = state_.base;
    for (const DevLayer<T>& d : layers_) {
      LayerState st;
      if (d.is_attention) {
        const int64_t b = align_up(n_seq * max_len * kv * int64_t(sizeof(T)));
        st.k = reinterpret_cast<T*>(p);
        st.v = reinterpret_cast<T*>(p + b);
        p += 2 * b;
      } else {
        st.conv = reinterpret_cast<float*>(p);
        p += align_up(n_seq * (L - 1) * H * int64_t(sizeof(float)));
      }
      state_.layers.push_back(st);
    }
    state_.lengths = reinterpret_cast<int32_t*>(p);
    state_.ended = reinterpret_cast<int32_t*>(p + align_up(n_seq * 4));
    state_.eos = reinterpret_cast<int32_t*>(p + 2 * align_up(n_seq * 4));
    CUDA_CHECK(cudaMemcpy(state_.lengths, lengths, size_t(n_seq) * 4, cudaMemcpyHostToDevice));
    if (!sampling.eos.empty())
      CUDA_CHECK(cudaMemcpy(state_.eos, sampling.eos.data(), sampling.eos.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(state_.ended, 0xff, size_t(n_seq) * 4));  // -1: cpu::kNotEnded
    state_.host_lengths.assign(lengths, lengths + n_seq);
    state_.host_ended.assign(size_t(n_seq), cpu::kNotEnded);
    state_.n_seq = n_seq;
    state_.max_len = max_len;
    state_.sampling = sampling;
    if (range_.is_last && !sampling.greedy())  // sampling chooses on the host: a pinned copy of the logits
      state_.host_logits = static_cast<float*>(alloc_host(std::min(capacity_, n_seq) * cfg_.vocab_size * 4));
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len) override {
    check_state(first_seq, n_seq, seq_len);
    check_capacity(n_seq * seq_len, "prefill");
    CUDA_CHECK(cudaSetDevice(device_));
    layers(static_cast<float*>(x), n_seq, seq_len, Gen{true, first_seq, 0});
    if (range_.is_last) {
      CUDA_CHECK(cudaMemsetAsync(state_.ended + first_seq, 0xff, size_t(n_seq) * 4, stream_));
      std::fill(state_.host_ended.begin() + first_seq, state_.host_ended.begin() + first_seq + n_seq, cpu::kNotEnded);
    }
  }

  void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step) override {
    check_state(first_seq, n_seq, 1);
    for (int64_t i = 0; i < n_seq; ++i)
      LFM2_CHECK(state_.host_lengths[size_t(first_seq + i)] + step - 1 < state_.max_len, "cuda stage: decode step ",
                 step, " of sequence ", first_seq + i, " reaches past the state's ", state_.max_len, " positions");
    CUDA_CHECK(cudaSetDevice(device_));
    Gen gen{true, first_seq, step, decode_flags(x, n_seq, cfg_.hidden_size)};
    if (!graphs_on_) return layers(static_cast<float*>(x), n_seq, 1, gen);
    // One graph per buffer and microbatch size serves every microbatch and step: the kernels read
    // (first_seq, step) from decode_at_, written just before the replay.
    cuda::set_decode_at(decode_at_, first_seq, step, stream_);
    gen.at = decode_at_;
    replay(GraphKey{x, n_seq, 1, true}, [&] { layers(static_cast<float*>(x), n_seq, 1, gen); });
  }

  int32_t* alloc_tokens(int64_t n) override {
    CUDA_CHECK(cudaSetDevice(device_));
    token_bufs_.push_back(device_alloc(std::max<int64_t>(n, 1) * 4, "a token buffer", device_));
    return static_cast<int32_t*>(token_bufs_.back());
  }

  void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x) override {
    LFM2_CHECK(range_.is_first, "cuda stage: embed_tokens() on a stage that is not first");
    check_capacity(n_seq, "embed_tokens");
    CUDA_CHECK(cudaSetDevice(device_));
    cuda::embedding(static_cast<float*>(x), tokens, embed_, n_seq, cfg_.vocab_size, cfg_.hidden_size, stream_);
    cuda::finished_flags(decode_flags(x, n_seq, cfg_.hidden_size), tokens, n_seq, state_.eos,
                         int(state_.sampling.eos.size()), stream_);
  }

  // Greedy: the head, the argmax and the EOS rule on the device, the tokens copied to `host`
  // asynchronously. Sampling: the logits come to the host and cpu::choose_tokens picks (the
  // exact rule of the CPU backend; one host wait per microbatch step).
  void choose(const void* xv, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, int32_t* tokens,
              int32_t* host) override {
    LFM2_CHECK(range_.is_last, "cuda stage: choose() on a stage that is not last");
    check_state(first_seq, n_seq, seq_len);
    CUDA_CHECK(cudaSetDevice(device_));
    const float* x = static_cast<const float*>(xv);
    const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    const bool greedy = state_.sampling.greedy();
    for (int64_t r0 = 0; r0 < n_seq; r0 += kHeadRows) {
      const int64_t rows = std::min(kHeadRows, n_seq - r0);
      float* logits = head_.take_slot(stream_);
      cuda::rmsnorm_last(y_, x + r0 * seq_len * H, final_norm_, rows, seq_len, H, float(cfg_.norm_eps), stream_,
                         seq_len > 1 ? state_.lengths + first_seq + r0 : nullptr);
      cuda::linear_f32out(logits, y_, head_w_, rows, H, V, stream_, tf32_);
      if (greedy) {
        cuda::argmax_margin(head_.top, head_.margin, logits, rows, V, stream_);
        cuda::apply_eos(tokens + r0, head_.top, rows, first_seq + r0, state_.eos, int(state_.sampling.eos.size()),
                        state_.ended, stream_);
        if (host) copy_to_host(host + r0, tokens + r0, rows * 4);
      } else {
        copy_to_host(state_.host_logits + r0 * V, logits, rows * V * 4);
      }
    }
    if (greedy) return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<int64_t> seq(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) seq[size_t(i)] = first_seq + i;
    std::vector<int32_t> chosen(static_cast<size_t>(n_seq));
    cpu::choose_tokens(chosen.data(), state_.host_logits, n_seq, V, seq.data(), step, state_.sampling,
                       state_.host_ended.data(), 4);
    if (host) std::copy(chosen.begin(), chosen.end(), host);
    CUDA_CHECK(cudaMemcpy(tokens, chosen.data(), size_t(n_seq) * 4, cudaMemcpyHostToDevice));
  }

 private:
  // The layer loop of SPEC §1 (see the top of this file).
  // How the layers run: plainly (scoring), storing the sequences' state (prefill, step 0), or one
  // token per sequence against it (decode, step >= 1); positions as in ops.h's decode section.
  struct Gen {
    bool on = false;
    int64_t first_seq = 0, step = 0;
    const float* done = nullptr;  // decode: the finished flags (device), not routed to experts
    const int64_t* at = nullptr;  // decode in a graph: (first_seq, step) on the device
  };

  void layers(float* x, int64_t n_seq, int64_t seq_len, const Gen& gen = Gen{}) {
    const int64_t n = n_seq * seq_len;
    const int64_t H = cfg_.hidden_size;
    const float eps = float(cfg_.norm_eps);
    for (const DevLayer<T>& L : layers_) {
      cuda::rmsnorm(y_, x, L.operator_norm, n, H, eps, stream_);
      if (L.is_attention)
        attention_block(L, x, n_seq, seq_len, gen);
      else
        conv_block(L, x, n_seq, seq_len, gen);
      cuda::rmsnorm(y_, x, L.ffn_norm, n, H, eps, stream_);
      if (L.is_moe)
        moe_block(L, x, n, gen.done);
      else
        dense_block(L, x, n);
    }
  }

  struct GraphKey {
    void* x;
    int64_t n_seq, seq_len;
    bool decode;  // a generation decode step (its layers read the cache and the conv state)
    bool operator<(const GraphKey& o) const {
      return std::tie(x, n_seq, seq_len, decode) < std::tie(o.x, o.n_seq, o.seq_len, o.decode);
    }
  };

  // Launches the graph of `key`, capturing `queue` (work on stream_ only) into it the first time.
  template <typename Queue>
  void replay(const GraphKey& key, Queue&& queue) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, capture(queue)).first;
    CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  }

  template <typename Queue>
  cudaGraphExec_t capture(Queue&& queue) {
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      queue();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);  // leaves the stream usable; the error is the first one
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(err);
    return exec;
  }

  void copy_to_host(void* host, const void* dev, int64_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(host, dev, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
  }

  void attention_block(const DevLayer<T>& L, float* x, int64_t n_seq, int64_t seq_len, const Gen& gen) {
    const int64_t n = n_seq * seq_len, H = cfg_.hidden_size, hd = cfg_.head_dim();
    const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, width = (nh + 2 * nkv) * hd;
    cuda::linear(big_, y_, L.wqkv, n, H, width, stream_, tf32_);
    cuda::qk_norm_rope(big_, L.q_norm, L.k_norm, inv_freq_, n_seq, seq_len, nh, nkv, hd, float(cfg_.norm_eps),
                       stream_, state_.lengths, gen.first_seq, gen.step, gen.at);
    const float scale = float(std::pow(double(hd), -0.5));
    if (gen.on) {
      const LayerState& st = state_.layers[size_t(&L - layers_.data())];
      cuda::kv_cache_store(st.k, st.v, big_, n, seq_len, nh, nkv, hd, state_.lengths, gen.first_seq, gen.step,
                           state_.max_len, stream_, gen.at);
      if (gen.step > 0) {
        cuda::attention_decode(mid_, big_, st.k, st.v, n, nh, nkv, hd, scale, state_.lengths, gen.first_seq, gen.step,
                               state_.max_len, stream_, gen.at);
        cuda::linear_add_f32(x, mid_, L.attn_out, n, nh * hd, H, stream_, tf32_);
        return;
      }
    }
    cuda::attention(mid_, big_, big_ + nh * hd, big_ + (nh + nkv) * hd, n_seq, seq_len, nh, nkv, hd, scale, stream_,
                    width, width);
    cuda::linear_add_f32(x, mid_, L.attn_out, n, nh * hd, H, stream_, tf32_);
  }

  void conv_block(const DevLayer<T>& L, float* x, int64_t n_seq, int64_t seq_len, const Gen& gen) {
    const int64_t n = n_seq * seq_len, H = cfg_.hidden_size, K = cfg_.conv_L_cache;
    cuda::linear(big_, y_, L.conv_in, n, H, 3 * H, stream_, tf32_);
    float* conv_state = gen.on ? state_.layers[size_t(&L - layers_.data())].conv : nullptr;
    if (gen.on && gen.step > 0)
      cuda::short_conv_decode(mid_, big_, L.conv_w, conv_state, state_.lengths, gen.first_seq, gen.step, gen.at, n, H,
                              K, stream_);
    else
      cuda::short_conv(mid_, big_, L.conv_w, n_seq, seq_len, H, K, stream_);
    if (gen.on && gen.step == 0)
      cuda::short_conv_state(conv_state, big_, state_.lengths, gen.first_seq, n_seq, seq_len, H, K, stream_);
    cuda::linear_add_f32(x, mid_, L.conv_out, n, H, H, stream_, tf32_);
  }

  void dense_block(const DevLayer<T>& L, float* x, int64_t n) {
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    cuda::linear(big_, y_, L.w13, n, H, 2 * I, stream_, tf32_);
    cuda::swiglu(mid_, big_, n, I, stream_);
    cuda::linear_add_f32(x, mid_, L.w2, n, I, H, stream_, tf32_);
  }

  void moe_block(const DevLayer<T>& L, float* x, int64_t n, const float* done = nullptr) {
    const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
    const int64_t k = cfg_.num_experts_per_tok;
    cuda::linear_f32out(router_logits_, y_, L.gate, n, H, E, stream_, tf32_);
    cuda::moe_router(topk_w_, topk_ids_, router_logits_, L.expert_bias, n, E, k, cfg_.norm_topk_prob,
                     float(cfg_.routed_scaling_factor), stream_);
    if (done) cuda::moe_drop_rows(topk_ids_, done, n, k, stream_);
    cuda::moe_experts(x, y_, L.w13, L.w2, topk_ids_, topk_w_, n, H, E, Im, k, moe_scratch_, stream_);
  }

  // bf16/fp16: the grouped GEMM (CUTLASS, TMA) needs Hopper and 16-byte rows; refuse up front
  // rather than at the first forward.
  void check_sixteen_bit_shapes() const {
    bool any_moe = false;
    for (int il = range_.layer_begin; il < range_.layer_end; ++il) any_moe = any_moe || cfg_.is_moe(il);
    if (!any_moe) return;
    const cuda::DeviceInfo& info = cuda::device_info(device_);
    LFM2_CHECK(info.major == 9 && info.minor == 0, "cuda stage: ", dtype_name(dtype_of<T>()),
               " MoE layers need a Hopper GPU (sm_90: the CUTLASS grouped GEMM); device ", device_, " is sm_",
               info.major, info.minor, " (use --dtype fp32)");
    LFM2_CHECK(cfg_.hidden_size % 8 == 0 && cfg_.moe_intermediate_size % 8 == 0, "cuda stage: ",
               dtype_name(dtype_of<T>()), " MoE layers need hidden_size (", cfg_.hidden_size,
               ") and moe_intermediate_size (", cfg_.moe_intermediate_size, ") to be multiples of 8");
  }

  void check_state(int64_t first_seq, int64_t n_seq, int64_t seq_len) const {
    LFM2_CHECK(state_.base, "cuda stage: generation before alloc_state()");
    LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= state_.n_seq && seq_len <= state_.max_len, "cuda stage: sequences [",
               first_seq, ", ", first_seq + n_seq, ") of ", seq_len, " tokens outside the state of ", state_.n_seq, " x ",
               state_.max_len);
  }

  void free_state() {
    if (state_.base) cudaFree(state_.base);
    state_ = State{};
  }

  void check_capacity(int64_t n_tokens, const char* what) const {
    LFM2_CHECK(n_tokens > 0 && n_tokens <= capacity_, "cuda stage: ", what, " of ", n_tokens,
               " tokens, but buffers were allocated for ", capacity_, " (alloc_hidden)");
  }

  // ---- weights: the stage's tensors straight from the file into one device allocation, matrices
  // in T (q/k/v stacked, w1/w3 stacked; per expert for the MoE), norms and conv taps in fp32.
  void upload_weights(WeightReader& reader) {
    const int il0 = range_.layer_begin, il1 = range_.layer_end;
    WeightUploader up(reader, stage_tensor_specs(cfg_, il0, il1, range_.is_first, range_.is_last), device_);
    const DType t = dtype_of<T>(), f32 = DType::F32;
    struct Offs {
      int64_t op_norm = -1, ffn_norm = -1, wqkv = -1, qn = -1, kn = -1, ao = -1, cw = -1, ci = -1, co = -1, w13 = -1,
              w2 = -1, gate = -1, bias = -1;
    };
    std::vector<Offs> offs;
    for (int il = il0; il < il1; ++il) {
      auto p = [&](const char* leaf) { return layer_path(il, leaf); };
      Offs o;
      o.op_norm = up.reserve(p("operator_norm"), f32);
      o.ffn_norm = up.reserve(p("ffn_norm"), f32);
      if (cfg_.is_attention(il)) {
        o.wqkv = up.reserve({p("self_attn/q_proj"), p("self_attn/k_proj"), p("self_attn/v_proj")}, t);
        o.qn = up.reserve(p("self_attn/q_layernorm"), f32);
        o.kn = up.reserve(p("self_attn/k_layernorm"), f32);
        o.ao = up.reserve(p("self_attn/out_proj"), t);
      } else {
        o.cw = up.reserve(p("conv/conv"), f32);
        o.ci = up.reserve(p("conv/in_proj"), t);
        o.co = up.reserve(p("conv/out_proj"), t);
      }
      if (cfg_.is_moe(il)) {
        o.gate = up.reserve(p("feed_forward/gate"), t);
        if (up.has(p("feed_forward/expert_bias"))) o.bias = up.reserve(p("feed_forward/expert_bias"), f32);
        o.w13 = up.reserve({p("feed_forward/experts/w1"), p("feed_forward/experts/w3")}, t, /*interleave=*/true);
        o.w2 = up.reserve(p("feed_forward/experts/w2"), t);
      } else {
        o.w13 = up.reserve({p("feed_forward/w1"), p("feed_forward/w3")}, t);
        o.w2 = up.reserve(p("feed_forward/w2"), t);
      }
      offs.push_back(o);
    }
    int64_t off_embed = -1, off_norm = -1, off_head = -1;
    if (range_.is_first || (range_.is_last && cfg_.tie_word_embeddings)) off_embed = up.reserve(names::kEmbedTokens, t);
    if (range_.is_last) {
      off_norm = up.reserve(names::kEmbeddingNorm, f32);
      if (!cfg_.tie_word_embeddings) off_head = up.reserve(names::kLmHead, t);
    }
    std::vector<float> inv_freq(size_t(std::max<int64_t>(cfg_.head_dim() / 2, 1)));
    cpu::rope_inv_freq(inv_freq.data(), cfg_.head_dim(), cfg_.rope_theta);
    const int64_t off_if = up.reserve_host(inv_freq);

    arena_.reserve(up.total_bytes());
    arena_.allocate(device_);
    up.upload(arena_.base(), cat("uploading ", il1 - il0, " layers to GPU ", device_));

    auto tp = [&](int64_t o) -> const T* { return o < 0 ? nullptr : reinterpret_cast<const T*>(arena_.base() + o); };
    auto fp = [&](int64_t o) -> const float* {
      return o < 0 ? nullptr : reinterpret_cast<const float*>(arena_.base() + o);
    };
    for (int il = il0; il < il1; ++il) {
      const Offs& o = offs[size_t(il - il0)];
      DevLayer<T> d;
      d.is_attention = cfg_.is_attention(il);
      d.is_moe = cfg_.is_moe(il);
      d.operator_norm = fp(o.op_norm);
      d.ffn_norm = fp(o.ffn_norm);
      d.wqkv = tp(o.wqkv);
      d.q_norm = fp(o.qn);
      d.k_norm = fp(o.kn);
      d.attn_out = tp(o.ao);
      d.conv_w = fp(o.cw);
      d.conv_in = tp(o.ci);
      d.conv_out = tp(o.co);
      d.w13 = tp(o.w13);
      d.w2 = tp(o.w2);
      d.gate = tp(o.gate);
      d.expert_bias = fp(o.bias);
      layers_.push_back(d);
    }
    embed_ = tp(off_embed);
    final_norm_ = fp(off_norm);
    head_w_ = cfg_.tie_word_embeddings ? embed_ : tp(off_head);
    inv_freq_ = fp(off_if);
  }

  // ---- scratch, sized for max_tokens tokens
  void ensure_scratch(int64_t max_tokens) {
    if (max_tokens <= capacity_) return;
    free_scratch();
    const int64_t N = max_tokens, H = cfg_.hidden_size, hd = cfg_.head_dim();
    const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
    const int64_t I = cfg_.intermediate_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
    const int64_t k = cfg_.num_experts_per_tok, et = sizeof(T);
    const int64_t big_w = std::max({(nh + 2 * nkv) * hd, 3 * H, 2 * I});
    const int64_t mid_w = std::max({nh * hd, H, I});
    int64_t total = 0;
    auto res = [&](int64_t bytes) {
      const int64_t o = total;
      total += align_up(bytes);
      return o;
    };
    const int64_t o_y = res(std::max(N, kHeadRows) * H * et), o_big = res(N * big_w * et), o_mid = res(N * mid_w * et);
    const int64_t o_logits = res(N * E * 4), o_w = res(N * k * 4), o_ids = res(N * k * 4);
    const int64_t o_moe = res(cuda::moe_experts_scratch_bytes(N, H, E, Im, k, et));
    const int64_t o_tok = res(N * 4);
    scratch_ = static_cast<char*>(device_alloc(total, cat("scratch for ", N, " tokens"), device_));
    y_ = reinterpret_cast<T*>(scratch_ + o_y);
    big_ = reinterpret_cast<T*>(scratch_ + o_big);
    mid_ = reinterpret_cast<T*>(scratch_ + o_mid);
    router_logits_ = reinterpret_cast<float*>(scratch_ + o_logits);
    topk_w_ = reinterpret_cast<float*>(scratch_ + o_w);
    topk_ids_ = reinterpret_cast<int32_t*>(scratch_ + o_ids);
    moe_scratch_ = scratch_ + o_moe;
    ids_ = reinterpret_cast<int32_t*>(scratch_ + o_tok);
    capacity_ = N;
  }

  void free_scratch() {
    if (scratch_) {
      cudaStreamSynchronize(stream_);
      cudaFree(scratch_);
    }
    scratch_ = nullptr;
    capacity_ = 0;
  }

  ModelConfig cfg_;
  StageRange range_;
  int device_;
  bool tf32_;
  bool graphs_on_;                               // capture forward() and decode steps into CUDA Graphs
  std::map<GraphKey, cudaGraphExec_t> graphs_;   // one per hidden buffer, shape and kind
  int64_t* decode_at_ = nullptr;                 // (first_seq, step) of the decode step being replayed
  cudaStream_t stream_ = nullptr;                // compute
  cudaStream_t d2h_stream_ = nullptr;            // logits to the host
  HeadBuffers head_;                             // last stage
  // Generation state (alloc_state), one device allocation.
  struct LayerState {
    T *k = nullptr, *v = nullptr;  // attention: (N, max_len, nkv * hd)
    float* conv = nullptr;         // conv: (N, L - 1, H), u = B * x of the last positions
  };
  struct State {
    char* base = nullptr;
    std::vector<LayerState> layers;  // per layer of this stage
    int32_t* lengths = nullptr;      // (N) prompt lengths
    int32_t* ended = nullptr;        // (N) last stage: the EOS id each produced, -1 before
    int32_t* eos = nullptr;          // the EOS ids
    int64_t n_seq = 0, max_len = 0;
    std::vector<int32_t> host_lengths;
    std::vector<int32_t> host_ended;     // sampling: the EOS ids the host keeps
    SamplingParams sampling;
    float* host_logits = nullptr;        // sampling: pinned (microbatch, V)
  } state_;
  std::vector<void*> token_bufs_;                // alloc_tokens()
  std::vector<void*> host_;                      // alloc_host()
  unsigned int* nonfinite_ = nullptr;            // count_nonfinite()'s device counter
  WeightArena arena_;
  std::vector<DevLayer<T>> layers_;
  const T* embed_ = nullptr;          // (V, H)
  const T* head_w_ = nullptr;         // (V, H): lm_head or embed_tokens
  const float* final_norm_ = nullptr; // (H)
  const float* inv_freq_ = nullptr;   // (hd / 2)
  std::vector<void*> hidden_;
  char* scratch_ = nullptr;
  int64_t capacity_ = 0;
  T *y_ = nullptr, *big_ = nullptr, *mid_ = nullptr;
  float *router_logits_ = nullptr, *topk_w_ = nullptr;
  int32_t *topk_ids_ = nullptr, *ids_ = nullptr;
  void* moe_scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<CudaStageExecutor> make_cuda_stage(WeightReader& weights, const StageRange& range,
                                                   DType compute_dtype, int device, bool tf32, bool graphs,
                                                   int reserved_sms) {
  cuda::reserve_sms(device, reserved_sms);
  switch (compute_dtype) {
    case DType::F32: return std::make_unique<CudaStage<float>>(weights, range, device, tf32, graphs);
    case DType::BF16: return std::make_unique<CudaStage<__nv_bfloat16>>(weights, range, device, false, graphs);
    case DType::F16: return std::make_unique<CudaStage<__half>>(weights, range, device, false, graphs);
  }
  LFM2_FAIL("cuda stage: unknown compute dtype");
}

}  // namespace lfm2
