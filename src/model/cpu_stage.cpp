// The CPU reference StageExecutor: SPEC §1 / HF Lfm2MoeDecoderLayer built from the lfm2::cpu kernels,
// fp32 weights and activations, fp32 accumulation. Deterministic for any thread count. Its rooms:
// the weights (layer_weights.h), the layer loop (cpu_layers.h) and generation's state
// (cpu_decode_state.h), as the CUDA stage's (cuda_stage.cpp).
#include <algorithm>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/parallel.h"
#include "kernels/argmax.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rmsnorm.h"
#include "kernels/sample.h"
#include "model/cpu_decode_state.h"
#include "model/cpu_layers.h"
#include "model/layer_weights.h"
#include "model/stage_executor.h"

namespace lfm2 {

namespace {

class CpuStage final : public StageExecutor {
  using Rows = CpuLayers::StepRows;

 public:
  CpuStage(WeightReader& reader, const StageLayers& stage, int n_threads)
      : w_(load_model_weights(reader, stage)),
        cfg_(w_.config),
        n_threads_(resolve_threads(n_threads)),
        layers_(cfg_, w_, state_, n_threads_) {}

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
    layers_.run(static_cast<float*>(x), n_seq, seq_len, Rows{});
  }

  // ---- generation: the state lives in state_ (cpu_decode_state.h)
  int64_t state_bytes(int64_t n_seq, int64_t max_len) const override {
    return CpuDecodeState::bytes(cfg_, w_.layers, w_.stage.is_last(), n_seq, max_len);
  }

  void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& sampling) override {
    state_.allocate(cfg_, w_.layers, n_seq, max_len, lengths, sampling);
  }

  void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len) override {
    state_.check(first_seq, n_seq, seq_len);
    layers_.run(static_cast<float*>(x), n_seq, seq_len, Rows{Rows::kPrefill, first_seq, nullptr});
    state_.restart(first_seq, n_seq);
  }

  void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step) override {
    const std::vector<int64_t> pos = state_.decode_positions(first_seq, n_seq, step);
    const float* done = decode_flags(x, n_seq, cfg_.hidden_size);
    layers_.run(static_cast<float*>(x), n_seq, 1, Rows{Rows::kDecode, first_seq, pos.data(), done});
  }

  int32_t* alloc_tokens(int64_t n) override {
    tokens_.push_back(std::make_unique<int32_t[]>(size_t(std::max<int64_t>(n, 1))));
    return tokens_.back().get();
  }

  void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x) override {
    embed(tokens, n_seq, 1, x);
    cpu::finished_flags(decode_flags(x, n_seq, cfg_.hidden_size), tokens, n_seq, state_.sampling.eos);
  }

  void choose(const void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, int32_t* tokens,
              int32_t* host) override {
    LFM2_CHECK(w_.stage.is_last(), "cpu stage: choose() on a stage that is not last");
    state_.check(first_seq, n_seq, seq_len);
    std::vector<int32_t> last(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) last[size_t(i)] = seq_len == 1 ? 1 : state_.lengths[size_t(first_seq + i)];
    std::vector<float> logits(static_cast<size_t>(n_seq * cfg_.vocab_size));
    HeadOutputs out;
    out.logits = logits.data();
    head(x, n_seq, seq_len, last.data(), out);
    std::vector<int64_t> seq(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) seq[size_t(i)] = first_seq + i;
    cpu::choose_tokens(tokens, logits.data(), n_seq, cfg_.vocab_size, seq.data(), step, state_.sampling,
                       state_.ended.data(), n_threads_);
    if (host) std::copy(tokens, tokens + n_seq, host);
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

std::unique_ptr<StageExecutor> make_cpu_stage(WeightReader& weights, const StageLayers& stage, int n_threads) {
  return std::make_unique<CpuStage>(weights, stage, n_threads);
}

}  // namespace lfm2
