// The CUDA StageExecutor (see cuda_stage.h): one pipeline stage on one GPU, put together from its
// rooms, each a file of its own:
//   cuda_weights.h       the stage's weights, named as LayerWeights names them, in one allocation
//   cuda_layers.h        the layer loop (mirroring cpu_layers.h) and its scratch
//   cuda_graphs.h        CUDA Graphs of the layer loop, per buffer, shape and kind
//   cuda_decode_state.h  generation's state (KV cache, conv state, block table) and a step's descriptors
//   cuda_token_choice.h  the last stage's token choice (EOS state per slot, greedy on the device,
//                        sampling on the host)
//   cuda_head.h          the LM head: logits slots, top-1 and margin, copies to the host
// Every method queues its work on the compute stream; forward() and decode steps replay graphs.
#include "model/cuda_stage.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/ops.h"
#include "model/cuda_decode_state.h"
#include "model/cuda_graphs.h"
#include "model/cuda_head.h"
#include "model/cuda_layers.h"
#include "model/cuda_memory.h"
#include "model/cuda_token_choice.h"
#include "model/cuda_weights.h"
#include "model/step_layout.h"

namespace lfm2 {
namespace {

// The stage's device, made current, and its two streams: compute, and the logits' copies to the host.
struct DeviceStreams {
  explicit DeviceStreams(int device) {
    int n_dev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n_dev));
    LFM2_CHECK(device >= 0 && device < n_dev, "cuda stage: device ", device, " does not exist (", n_dev,
               " visible)");
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking));
  }
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;
  ~DeviceStreams() {
    for (cudaStream_t s : {compute, d2h})
      if (s) cudaStreamDestroy(s);
  }
  cudaStream_t compute = nullptr, d2h = nullptr;
};

// bf16/fp16: the grouped GEMM (CUTLASS, TMA) needs Hopper and 16-byte rows; refuse up front rather
// than at the first forward.
void check_sixteen_bit_shapes(const ModelConfig& cfg, const StageLayers& stage, int device, DType dtype) {
  bool any_moe = false;
  for (int il = stage.layer_begin; il < stage.layer_end; ++il) any_moe = any_moe || cfg.is_moe(il);
  if (!any_moe) return;
  const cuda::DeviceInfo& info = cuda::device_info(device);
  LFM2_CHECK(info.sm90a(), "cuda stage: ", dtype_name(dtype),
             " MoE layers need a Hopper GPU (sm_90: the CUTLASS grouped GEMM); device ", device, " is sm_",
             info.major, info.minor, " (use --dtype fp32)");
  LFM2_CHECK(cfg.hidden_size % 8 == 0 && cfg.moe_intermediate_size % 8 == 0, "cuda stage: ", dtype_name(dtype),
             " MoE layers need hidden_size (", cfg.hidden_size, ") and moe_intermediate_size (",
             cfg.moe_intermediate_size, ") to be multiples of 8");
}

template <typename T>
class CudaStage final : public CudaStageExecutor {
 public:
  CudaStage(WeightReader& reader, const StageLayers& stage, int device, bool tf32, bool graphs, bool kv_fp8)
      : cfg_(reader.config()), stage_(stage), device_(device), tf32_(tf32), streams_(device),
        stream_(streams_.compute), state_(kv_fp8), layers_(cfg_, weights_, state_, stream_, tf32),
        graphs_(graphs && !cuda_sync_check_enabled()) {
    LFM2_CHECK(!kv_fp8 || !(std::is_same<T, float>::value),
               "--kv-dtype fp8: the CUDA backend reads an fp8 KV cache in bf16 or fp16 (--dtype bf16 / fp16), not "
               "fp32");
    if (!std::is_same<T, float>::value) check_sixteen_bit_shapes(cfg_, stage_, device_, dtype_of<T>());
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&nonfinite_), sizeof(unsigned int)));
    cuda::cublas_prepare();
    weights_.upload(reader, stage_, device_);
    head_.init(cfg_, weights_, tf32_);
  }

  // The buffers handed out here, once the queued work is done; the rooms free their own after.
  ~CudaStage() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(streams_.d2h);
    for (void* p : hidden_) cudaFree(p);
    for (void* p : token_bufs_) cudaFree(p);
    for (void* p : host_) cudaFreeHost(p);
    cudaFree(nonfinite_);
  }

  DType act_dtype() const override { return DType::F32; }
  bool on_device() const override { return true; }
  int64_t weight_bytes() const override { return weights_.bytes(); }
  int device() const override { return device_; }
  CUstream_st* stream() const override { return stream_; }
  DType compute_dtype() const override { return dtype_of<T>(); }
  void wait_event(CUevent_st* event) override { CUDA_CHECK(cudaStreamWaitEvent(stream_, event, 0)); }
  void record_event(CUevent_st* event) override { CUDA_CHECK(cudaEventRecord(event, stream_)); }

  void* alloc_hidden(int64_t max_tokens) override {
    LFM2_CHECK(max_tokens > 0, "cuda stage: alloc_hidden(", max_tokens, ")");
    CUDA_CHECK(cudaSetDevice(device_));
    layers_.reserve(max_tokens, CudaHead<T>::kRows, device_);
    if (stage_.is_last()) head_.allocate(device_);
    hidden_.push_back(device_alloc(max_tokens * cfg_.hidden_size * int64_t(sizeof(float)),
                                   cat("a hidden-state buffer of ", max_tokens, " tokens"), device_));
    return hidden_.back();
  }

  void* alloc_host(int64_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    host_.push_back(pinned_alloc(bytes, device_));
    return host_.back();
  }

  void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) override {
    LFM2_CHECK(stage_.is_first(), "cuda stage: embed() on a stage that is not first");
    const int64_t n = n_seq * seq_len;
    check_capacity(n, "embed");
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemcpyAsync(layers_.ids(), ids, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    cuda::embedding(static_cast<float*>(x), layers_.ids(), weights_.embed_tokens, n, cfg_.vocab_size,
                    cfg_.hidden_size, stream_);
  }

  // The layers, replayed from a CUDA Graph captured once per (buffer, shape).
  void forward(void* xv, int64_t n_seq, int64_t seq_len) override {
    check_capacity(n_seq * seq_len, "forward");
    CUDA_CHECK(cudaSetDevice(device_));
    float* x = static_cast<float*>(xv);
    graphs_.run({xv, n_seq, seq_len, CudaGraphs::Kind::kForward}, stream_,
                [&] { layers_.run(x, n_seq, seq_len); });
  }

  void head(const void* xv, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) override {
    LFM2_CHECK(stage_.is_last(), "cuda stage: head() on a stage that is not last");
    check_capacity(n_seq * seq_len, "head");
    CUDA_CHECK(cudaSetDevice(device_));
    head_.run(layers_.y(), static_cast<const float*>(xv), n_seq, seq_len, lengths, out, stream_, streams_.d2h);
  }

  void synchronize() override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaStreamSynchronize(streams_.d2h));
  }

  // One device counter serves every check: zeroed, counted and copied out in stream order.
  bool count_nonfinite(const void* buf, int64_t n, uint32_t* count) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemsetAsync(nonfinite_, 0, sizeof(unsigned int), stream_));
    cuda::count_nonfinite(nonfinite_, static_cast<const float*>(buf), n, stream_);
    CUDA_CHECK(cudaMemcpyAsync(count, nonfinite_, sizeof(unsigned int), cudaMemcpyDeviceToHost, stream_));
    return true;
  }

  // ---- generation: the state lives in state_ (cuda_decode_state.h). Today's calls are steps of the
  // batch API's internals with sequence i in slot i (old_state_shape).
  int64_t state_bytes(int64_t n_seq, int64_t max_len) const override {
    return state_.bytes(cfg_, weights_.layers, old_state_shape(n_seq, max_len));
  }

  void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& sampling) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    graphs_.forget(CudaGraphs::Kind::kDecode);  // they hold the addresses of the state they were captured with
    state_.allocate_old(cfg_, weights_.layers, n_seq, max_len, lengths, sampling, device_);
    if (stage_.is_last() && !sampling.greedy()) state_.choice().allow_sampling(n_seq, cfg_.vocab_size, device_);
  }

  void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len) override {
    state_.old().check(first_seq, n_seq, seq_len, "cuda stage");
    run_step(static_cast<float*>(x), StepLayout::prefill(first_seq, n_seq, seq_len, state_.old().lengths.data()),
             nullptr);
  }

  void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step) override {
    const std::vector<int64_t> pos = state_.old().decode_positions(first_seq, n_seq, step, "cuda stage");
    run_step(static_cast<float*>(x), StepLayout::decode(first_seq, n_seq, pos), decode_flags(x, n_seq, cfg_.hidden_size));
  }

  int32_t* alloc_tokens(int64_t n) override {
    CUDA_CHECK(cudaSetDevice(device_));
    token_bufs_.push_back(device_alloc(std::max<int64_t>(n, 1) * 4, "a token buffer", device_));
    return static_cast<int32_t*>(token_bufs_.back());
  }

  void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x) override {
    LFM2_CHECK(stage_.is_first(), "cuda stage: embed_tokens() on a stage that is not first");
    check_capacity(n_seq, "embed_tokens");
    CUDA_CHECK(cudaSetDevice(device_));
    cuda::embedding(static_cast<float*>(x), tokens, weights_.embed_tokens, n_seq, cfg_.vocab_size, cfg_.hidden_size,
                    stream_);
    state_.choice().finished_flags(decode_flags(x, n_seq, cfg_.hidden_size), tokens, n_seq, stream_);
  }

  void choose(const void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, int32_t* tokens,
              int32_t* host) override {
    LFM2_CHECK(stage_.is_last(), "cuda stage: choose() on a stage that is not last");
    state_.old().check(first_seq, n_seq, seq_len, "cuda stage");
    const auto emits = step_emits(first_seq, n_seq, seq_len, step, state_.old().lengths.data(),
                                  state_.choice().sampling().first_sequence);
    choose_rows(static_cast<const float*>(x), emits, nullptr, tokens, host);
  }

  // ---- generation in batches (step_batch.h)
  int64_t page_bytes(int64_t page_size) const override {
    return state_.page_bytes(cfg_, weights_.layers, page_size);
  }
  int64_t slot_bytes() const override { return state_.slot_bytes(cfg_, weights_.layers); }

  void alloc_batch_state(const StateShape& shape, const SamplingParams& sampling) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    graphs_.forget(CudaGraphs::Kind::kDecode);
    state_.allocate(cfg_, weights_.layers, shape, sampling, device_);
    if (stage_.is_last()) state_.choice().allow_sampling(shape.n_slots, cfg_.vocab_size, device_);
  }

  void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n) override {
    CUDA_CHECK(cudaSetDevice(device_));
    state_.map_pages(slot, first, pages, n, stream_);
  }

  void embed_batch(const StepBatch& b, const int32_t* prompt_ids, const int32_t* fed, void* xv) override {
    LFM2_CHECK(stage_.is_first(), "cuda stage: embed_batch() on a stage that is not first");
    check_batch(b);
    check_capacity(b.rows(), "embed_batch");
    CUDA_CHECK(cudaSetDevice(device_));
    float* x = static_cast<float*>(xv);
    const int64_t nd = b.n_decode(), np = b.rows() - nd, H = cfg_.hidden_size, V = cfg_.vocab_size;
    if (nd) cuda::embedding(x, fed, weights_.embed_tokens, nd, V, H, stream_);
    if (np) {
      CUDA_CHECK(cudaMemcpyAsync(layers_.ids(), prompt_ids, size_t(np) * 4, cudaMemcpyHostToDevice, stream_));
      cuda::embedding(x + nd * H, layers_.ids(), weights_.embed_tokens, np, V, H, stream_);
    }
    state_.choice().finished_flags(decode_flags(x, b.rows(), H), fed, nd, stream_);
  }

  void copy_tokens(int32_t* dst, const int32_t* src, int64_t n) override {
    if (n <= 0) return;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyDefault, stream_));
  }

  void forward_batch(void* x, const StepBatch& b) override {
    check_batch(b);
    run_step(static_cast<float*>(x), StepLayout::of(b), decode_flags(x, b.rows(), cfg_.hidden_size));
  }

  void choose_batch(const void* x, const StepBatch& b, const SeqSampling* params, int32_t* tokens,
                    int32_t* host) override {
    LFM2_CHECK(stage_.is_last(), "cuda stage: choose_batch() on a stage that is not last");
    check_batch(b);
    choose_rows(static_cast<const float*>(x), step_emits(b), params, tokens, host);
  }

 private:
  // A step's layers: its descriptors written in stream order, then the layers, a step of decode
  // rows alone replayed from the graph of its (buffer, rows); the last stage restarts the EOS state
  // of the slots that start a sequence.
  void run_step(float* x, const StepLayout& step, const float* done) {
    state_.check(step);
    check_capacity(step.rows, "a generation step");
    CUDA_CHECK(cudaSetDevice(device_));
    const StepDevice dev = state_.upload(step, done, stream_);
    if (step.n_decode == step.n_seqs())
      graphs_.run({x, step.rows, 1, CudaGraphs::Kind::kDecode}, stream_, [&] { layers_.run_step(x, dev); });
    else
      layers_.run_step(x, dev);
    if (stage_.is_last() && dev.n_fresh) state_.choice().restart(dev.fresh, dev.n_fresh, stream_);
  }

  // The token of each emitted row, kRows rows of logits at a time (cuda_token_choice.h: greedy on
  // the device, sampling on the host).
  void choose_rows(const float* x, const std::vector<StepEmit>& emits, const SeqSampling* params, int32_t* tokens,
                   int32_t* host) {
    CUDA_CHECK(cudaSetDevice(device_));
    const int64_t n = int64_t(emits.size()), V = cfg_.vocab_size, kRows = CudaHead<T>::kRows;
    if (n == 0) return;
    CudaTokenChoice& choice = state_.choice();
    const int32_t* rows = choice.upload_emits(emits, stream_);
    const bool greedy = choice.greedy(emits, params);
    for (int64_t r0 = 0; r0 < n; r0 += kRows) {
      const int64_t m = std::min(kRows, n - r0);
      const float* logits = head_.last_logits(layers_.y(), x, m, 0, rows + r0, stream_);  // rows[i] - 1: its row
      choice.choose_rows(tokens, host, logits, r0, m, greedy, V, head_.top(), head_.margin(), stream_);
    }
    if (!greedy) choice.choose_on_host(tokens, host, emits, params, V, stream_);
  }

  void check_batch(const StepBatch& b) const {
    LFM2_CHECK(state_.allocated(), "cuda stage: a batch step before alloc_batch_state()");
    b.check(state_.shape().n_slots, state_.shape().max_positions());
  }

  void check_capacity(int64_t n_tokens, const char* what) const {
    LFM2_CHECK(n_tokens > 0 && n_tokens <= layers_.capacity(), "cuda stage: ", what, " of ", n_tokens,
               " tokens, but buffers were allocated for ", layers_.capacity(), " (alloc_hidden)");
  }

  ModelConfig cfg_;
  StageLayers stage_;
  int device_;
  bool tf32_;
  DeviceStreams streams_;  // first made, last destroyed: every room below queues on its streams
  cudaStream_t stream_;    // compute (streams_.compute)
  DeviceWeights<T> weights_;
  DecodeState<T> state_;
  CudaLayers<T> layers_;
  CudaHead<T> head_;       // last stage
  CudaGraphs graphs_;
  unsigned int* nonfinite_ = nullptr;  // count_nonfinite()'s device counter
  std::vector<void*> hidden_;          // alloc_hidden()
  std::vector<void*> token_bufs_;      // alloc_tokens()
  std::vector<void*> host_;            // alloc_host()
};

}  // namespace

std::unique_ptr<CudaStageExecutor> make_cuda_stage(WeightReader& weights, const StageLayers& stage,
                                                   DType compute_dtype, int device, bool tf32, bool graphs,
                                                   int reserved_sms, bool kv_fp8) {
  cuda::reserve_sms(device, reserved_sms);
  switch (compute_dtype) {
    case DType::F32: return std::make_unique<CudaStage<float>>(weights, stage, device, tf32, graphs, kv_fp8);
    case DType::BF16:
      return std::make_unique<CudaStage<__nv_bfloat16>>(weights, stage, device, false, graphs, kv_fp8);
    case DType::F16: return std::make_unique<CudaStage<__half>>(weights, stage, device, false, graphs, kv_fp8);
    case DType::E4M3: break;  // a storage type (fp8 files are dequantized at upload), no compute dtype
  }
  LFM2_FAIL("cuda stage: unknown compute dtype");
}

}  // namespace lfm2
