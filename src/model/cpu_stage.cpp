// The CPU reference StageExecutor: SPEC §1 / HF Lfm2MoeDecoderLayer built from the lfm2::cpu kernels,
// fp32 weights and activations, fp32 accumulation. Deterministic for any thread count. Its rooms:
// the weights (layer_weights.h), the layer loop (cpu_layers.h), generation's state
// (cpu_decode_state.h) and its token choice (cpu_token_choice.h), as the CUDA stage's (cuda_stage.cpp).
#include <algorithm>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/parallel.h"
#include "kernels/argmax.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "model/cpu_decode_state.h"
#include "model/cpu_layers.h"
#include "model/cpu_token_choice.h"
#include "model/layer_weights.h"
#include "model/stage_executor.h"
#include "model/step_layout.h"

namespace lfm2 {

namespace {

class CpuStage final : public StageExecutor {

 public:
  CpuStage(WeightReader& reader, const StageLayers& stage, int n_threads, bool fp8_activations, bool kv_fp8)
      : w_(load_model_weights(reader, stage)),
        cfg_(w_.config),
        n_threads_(resolve_threads(n_threads)),
        layers_(cfg_, w_, state_, n_threads_, fp8_activations) {
    state_.kv_fp8 = kv_fp8;
  }

  DType act_dtype() const override { return DType::F32; }
  bool on_device() const override { return false; }
  int64_t weight_bytes() const override { return w_.bytes(); }

  void* alloc_hidden(int64_t max_tokens) override {
    LFM2_CHECK(max_tokens > 0, "cpu stage: alloc_hidden(", max_tokens, ")");
    buffers_.push_back(std::make_unique<float[]>(size_t(max_tokens * cfg_.hidden_size)));
    return buffers_.back().get();
  }

  void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) override {
    LFM2_CHECK(w_.stage.is_first(), "cpu stage: embed() on a stage that is not first");
    cpu::embedding(static_cast<float*>(x), ids, w_.embed_tokens.data(), n_seq * seq_len, cfg_.vocab_size,
                   cfg_.hidden_size, n_threads_);
  }

  void forward(void* x, int64_t n_seq, int64_t seq_len) override {
    layers_.run(static_cast<float*>(x), n_seq, seq_len);
  }

  // ---- generation: the state lives in state_ (cpu_decode_state.h). Today's calls are steps of the
  // batch API's internals with sequence i in slot i.
  int64_t state_bytes(int64_t n_seq, int64_t max_len) const override {
    const StateShape s = old_state_shape(n_seq, max_len);
    return s.n_pages * page_bytes(s.page_size) + s.n_slots * (slot_bytes() + s.max_pages * 4);
  }

  void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& sampling) override {
    state_.allocate_old(cfg_, w_.layers, w_.stage.is_last(), n_seq, max_len, lengths, sampling);
  }

  void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len) override {
    state_.old.check(first_seq, n_seq, seq_len, "cpu stage");
    run_step(static_cast<float*>(x), StepLayout::prefill(first_seq, n_seq, seq_len, state_.old.lengths.data()),
             nullptr);
  }

  void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step) override {
    const std::vector<int64_t> pos = state_.old.decode_positions(first_seq, n_seq, step, "cpu stage");
    run_step(static_cast<float*>(x), StepLayout::decode(first_seq, n_seq, pos),
             decode_flags(x, n_seq, cfg_.hidden_size));
  }

  int32_t* alloc_tokens(int64_t n) override {
    tokens_.push_back(std::make_unique<int32_t[]>(size_t(std::max<int64_t>(n, 1))));
    return tokens_.back().get();
  }

  void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x) override {
    embed(tokens, n_seq, 1, x);
    state_.choice.finished_flags(decode_flags(x, n_seq, cfg_.hidden_size), tokens, n_seq);
  }

  void choose(const void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, int32_t* tokens,
              int32_t* host) override {
    LFM2_CHECK(w_.stage.is_last(), "cpu stage: choose() on a stage that is not last");
    state_.old.check(first_seq, n_seq, seq_len, "cpu stage");
    const auto emits = step_emits(first_seq, n_seq, seq_len, step, state_.old.lengths.data(),
                                  state_.choice.sampling.first_sequence);
    choose_rows(static_cast<const float*>(x), emits, nullptr, tokens, host);
  }

  // ---- generation in batches (step_batch.h)
  int64_t page_bytes(int64_t page_size) const override {
    return CpuDecodeState::page_bytes(cfg_, w_.layers, page_size);
  }
  int64_t slot_bytes() const override { return CpuDecodeState::slot_bytes(cfg_, w_.layers, w_.stage.is_last()); }

  void alloc_batch_state(const StateShape& shape, const SamplingParams& sampling) override {
    state_.allocate(cfg_, w_.layers, w_.stage.is_last(), shape, sampling);
  }

  void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n) override {
    state_.map_pages(slot, first, pages, n);
  }

  void embed_batch(const StepBatch& b, const int32_t* prompt_ids, const int32_t* fed, void* xv) override {
    LFM2_CHECK(w_.stage.is_first(), "cpu stage: embed_batch() on a stage that is not first");
    b.check(state_.shape.n_slots, state_.shape.max_positions());
    float* x = static_cast<float*>(xv);
    const int64_t nd = b.n_decode(), H = cfg_.hidden_size;
    embed(fed, nd, 1, x);
    embed(prompt_ids, b.rows() - nd, 1, x + nd * H);
    state_.choice.finished_flags(decode_flags(x, b.rows(), H), fed, nd);
  }

  void forward_batch(void* xv, const StepBatch& b) override {
    b.check(state_.shape.n_slots, state_.shape.max_positions());
    run_step(static_cast<float*>(xv), StepLayout::of(b), decode_flags(xv, b.rows(), cfg_.hidden_size));
  }

  void choose_batch(const void* x, const StepBatch& b, const SeqSampling* params, int32_t* tokens,
                    int32_t* host) override {
    LFM2_CHECK(w_.stage.is_last(), "cpu stage: choose_batch() on a stage that is not last");
    b.check(state_.shape.n_slots, state_.shape.max_positions());
    choose_rows(static_cast<const float*>(x), step_emits(b), params, tokens, host);
  }

  void* alloc_host(int64_t bytes) override {
    host_.push_back(std::make_unique<char[]>(size_t(std::max<int64_t>(bytes, 1))));
    return host_.back().get();
  }

  void head(const void* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) override {
    LFM2_CHECK(w_.stage.is_last(), "cpu stage: head() on a stage that is not last");
    const float* h = static_cast<const float*>(x);
    const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    const float eps = float(cfg_.norm_eps);
    std::vector<float> normed(static_cast<size_t>(n_seq * H));
    for (int64_t s = 0; s < n_seq; ++s) {  // each sequence's last position
      const int64_t last = s * seq_len + (lengths ? lengths[s] : seq_len) - 1;
      cpu::rmsnorm(normed.data() + s * H, h + last * H, w_.embedding_norm.data(), 1, H, eps, 1);
    }
    float* logits = out.logits ? out.logits : grow(head_logits_, n_seq * V);
    cpu::linear(logits, normed.data(), w_.head_matrix(), n_seq, H, V, n_threads_);
    if (out.next_token) {
      std::vector<float> margin(static_cast<size_t>(n_seq));
      cpu::argmax_margin(out.next_token, margin.data(), logits, n_seq, V, n_threads_);
      if (out.margin) std::copy(margin.begin(), margin.end(), out.margin);
    }
    if (out.all_logits) {
      const int64_t rows = n_seq * seq_len;
      normed.resize(size_t(rows * H));
      cpu::rmsnorm(normed.data(), h, w_.embedding_norm.data(), rows, H, eps, n_threads_);
      cpu::linear(out.all_logits, normed.data(), w_.head_matrix(), rows, H, V, n_threads_);
    }
  }

  void synchronize() override {}

 private:
  // A step's layers, its pages checked first; the last stage restarts the EOS state of new sequences.
  void run_step(float* x, const StepLayout& step, const float* done) {
    state_.check(step);
    layers_.run_step(x, step, done);
    if (w_.stage.is_last()) state_.choice.restart(step.fresh);
  }

  // The token of each emitted row (its last position's logits), greedy or drawn by its sampling
  // (params: one per row, or null for the state's defaults), keyed by (seed, seq, gen_step); a
  // slot that has ended repeats its EOS id.
  void choose_rows(const float* x, const std::vector<StepEmit>& emits, const SeqSampling* params, int32_t* tokens,
                   int32_t* host) {
    const int64_t n = int64_t(emits.size()), H = cfg_.hidden_size, V = cfg_.vocab_size;
    std::vector<float> rows(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::copy(x + emits[size_t(i)].row * H, x + (emits[size_t(i)].row + 1) * H, rows.begin() + i * H);
    std::vector<float> logits(static_cast<size_t>(n * V));
    HeadOutputs out;
    out.logits = logits.data();
    head(rows.data(), n, 1, nullptr, out);
    state_.choice.choose(tokens, logits.data(), V, emits, params, n_threads_);
    if (host) std::copy(tokens, tokens + n, host);
  }

  static float* grow(std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }

  ModelWeights w_;
  const ModelConfig& cfg_;
  int n_threads_;
  CpuDecodeState state_;
  CpuLayers layers_;
  std::vector<std::unique_ptr<float[]>> buffers_;
  std::vector<std::unique_ptr<char[]>> host_;       // alloc_host()
  std::vector<std::unique_ptr<int32_t[]>> tokens_;  // alloc_tokens()
  std::vector<float> head_logits_;                  // head() where its caller wants no logits
};

}  // namespace

std::unique_ptr<StageExecutor> make_cpu_stage(WeightReader& weights, const StageLayers& stage, int n_threads,
                                              bool fp8_activations, bool kv_fp8) {
  return std::make_unique<CpuStage>(weights, stage, n_threads, fp8_activations, kv_fp8);
}

}  // namespace lfm2
