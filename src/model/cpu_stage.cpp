// The CPU reference StageExecutor: SPEC §1 / HF Lfm2MoeDecoderLayer built from the lfm2::cpu kernels,
// fp32 weights and activations, fp32 accumulation. Deterministic for any thread count.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/parallel.h"
#include "kernels/add.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_router.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sample.h"
#include "kernels/short_conv.h"
#include "kernels/swiglu.h"
#include "model/layer_weights.h"
#include "model/stage_executor.h"

namespace lfm2 {

namespace {

class CpuStage final : public StageExecutor {
 public:
  CpuStage(WeightReader& reader, const StageRange& range, int n_threads)
      : w_(load_model_weights(reader, range.layer_begin, range.layer_end, range.is_first, range.is_last)),
        cfg_(w_.config),
        n_threads_(resolve_threads(n_threads)) {
    inv_freq_.resize(size_t(cfg_.head_dim() / 2));
    cpu::rope_inv_freq(inv_freq_.data(), cfg_.head_dim(), cfg_.rope_theta);
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
    LFM2_CHECK(w_.is_first, "cpu stage: embed() on a stage that is not first");
    cpu::embedding(static_cast<float*>(x), ids, w_.embed_tokens.data(), n_seq * seq_len, cfg_.vocab_size,
                   cfg_.hidden_size, n_threads_);
  }

  void forward(void* x, int64_t n_seq, int64_t seq_len) override {
    float* h = static_cast<float*>(x);
    for (size_t li = 0; li < w_.layers.size(); ++li) layer_forward(li, h, n_seq, seq_len, Ctx{});
  }

  // ---- generation
  int64_t state_bytes(int64_t n_seq, int64_t max_len) const override {
    int64_t floats = 0;
    const int64_t kv = cfg_.num_key_value_heads * cfg_.head_dim(), L = cfg_.conv_L_cache;
    for (const LayerWeights& lw : w_.layers)
      floats += lw.is_attention ? 2 * n_seq * max_len * kv : n_seq * (L - 1) * cfg_.hidden_size;
    return floats * int64_t(sizeof(float)) + (w_.is_last ? n_seq : 0);
  }

  void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& sampling) override {
    const int64_t kv = cfg_.num_key_value_heads * cfg_.head_dim(), L = cfg_.conv_L_cache;
    state_.assign(w_.layers.size(), LayerState{});
    for (size_t li = 0; li < w_.layers.size(); ++li) {
      LayerState& st = state_[li];
      if (w_.layers[li].is_attention) {
        st.k.assign(size_t(n_seq * max_len * kv), 0.0f);
        st.v.assign(size_t(n_seq * max_len * kv), 0.0f);
      } else {
        st.conv.assign(size_t(n_seq * (L - 1) * cfg_.hidden_size), 0.0f);
      }
    }
    max_len_ = max_len;
    lengths_.assign(lengths, lengths + n_seq);
    sampling_ = sampling;
    ended_.assign(size_t(n_seq), cpu::kNotEnded);
  }

  void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len) override {
    check_state(first_seq, n_seq, seq_len);
    float* h = static_cast<float*>(x);
    for (size_t li = 0; li < w_.layers.size(); ++li)
      layer_forward(li, h, n_seq, seq_len, Ctx{Ctx::kPrefill, first_seq, nullptr});
    std::fill(ended_.begin() + first_seq, ended_.begin() + first_seq + n_seq, cpu::kNotEnded);
  }

  void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step) override {
    check_state(first_seq, n_seq, 1);
    std::vector<int64_t> pos(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) pos[size_t(i)] = lengths_[size_t(first_seq + i)] + step - 1;
    LFM2_CHECK(pos.empty() || *std::max_element(pos.begin(), pos.end()) < max_len_, "cpu stage: decode step ", step,
               " reaches past the state's ", max_len_, " positions");
    float* h = static_cast<float*>(x);
    const float* done = decode_flags(x, n_seq, cfg_.hidden_size);
    for (size_t li = 0; li < w_.layers.size(); ++li)
      layer_forward(li, h, n_seq, 1, Ctx{Ctx::kDecode, first_seq, pos.data(), done});
  }

  int32_t* alloc_tokens(int64_t n) override {
    tokens_.push_back(std::make_unique<int32_t[]>(size_t(std::max<int64_t>(n, 1))));
    return tokens_.back().get();
  }

  void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x) override {
    embed(tokens, n_seq, 1, x);
    cpu::finished_flags(decode_flags(x, n_seq, cfg_.hidden_size), tokens, n_seq, sampling_.eos);
  }

  void choose(const void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, int32_t* tokens,
              int32_t* host) override {
    LFM2_CHECK(w_.is_last, "cpu stage: choose() on a stage that is not last");
    check_state(first_seq, n_seq, seq_len);
    std::vector<int32_t> last(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) last[size_t(i)] = seq_len == 1 ? 1 : lengths_[size_t(first_seq + i)];
    std::vector<float> logits(static_cast<size_t>(n_seq * cfg_.vocab_size));
    HeadOutputs out;
    out.logits = logits.data();
    head(x, n_seq, seq_len, last.data(), out);
    std::vector<int64_t> seq(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) seq[size_t(i)] = first_seq + i;
    cpu::choose_tokens(tokens, logits.data(), n_seq, cfg_.vocab_size, seq.data(), step, sampling_, ended_.data(),
                       n_threads_);
    if (host) std::copy(tokens, tokens + n_seq, host);
  }

  void* alloc_host(int64_t bytes) override {
    host_.push_back(std::make_unique<char[]>(size_t(std::max<int64_t>(bytes, 1))));
    return host_.back().get();
  }

  void head(const void* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) override {
    LFM2_CHECK(w_.is_last, "cpu stage: head() on a stage that is not last");
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

  // How a layer runs: plainly (scoring), storing the sequences' state (prefill), or one token per
  // sequence against it (decode, positions pos; rows flagged in done are not routed to experts).
  struct Ctx {
    enum Kind { kPlain, kPrefill, kDecode } kind = kPlain;
    int64_t first_seq = 0;
    const int64_t* pos = nullptr;
    const float* done = nullptr;
  };

  // Each sequence's state in one layer of this stage (alloc_state).
  struct LayerState {
    std::vector<float> k, v;  // attention: (N, max_len, nkv * hd)
    std::vector<float> conv;  // conv: (N, L - 1, H), u = B * x of the last positions
  };

  void check_state(int64_t first_seq, int64_t n_seq, int64_t seq_len) const {
    LFM2_CHECK(!lengths_.empty(), "cpu stage: generation before alloc_state()");
    LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= int64_t(lengths_.size()) && seq_len <= max_len_,
               "cpu stage: sequences [", first_seq, ", ", first_seq + n_seq, ") of ", seq_len,
               " tokens outside the state of ", lengths_.size(), " x ", max_len_);
  }

  void layer_forward(size_t li, float* x, int64_t n_seq, int64_t seq_len, const Ctx& ctx) {
    const LayerWeights& lw = w_.layers[li];
    const int64_t T = n_seq * seq_len, H = cfg_.hidden_size;
    const float eps = float(cfg_.norm_eps);
    float* y = grow(y_, T * H);
    float* mix = grow(mix_, T * H);
    cpu::rmsnorm(y, x, lw.operator_norm.data(), T, H, eps, n_threads_);
    if (lw.is_attention)
      attention_block(li, y, mix, n_seq, seq_len, ctx);
    else
      conv_block(li, y, mix, n_seq, seq_len, ctx);
    cpu::add(x, x, mix, T * H, n_threads_);

    cpu::rmsnorm(y, x, lw.ffn_norm.data(), T, H, eps, n_threads_);
    if (lw.is_moe)
      moe_block(lw, y, mix, T, ctx.done);
    else
      dense_block(lw, y, mix, T);
    cpu::add(x, x, mix, T * H, n_threads_);
  }

  // out = out_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v)), HF Lfm2MoeAttention. Prefill
  // also stores every position's k and v in the cache; decode writes its own there first and
  // attends over the cache.
  void attention_block(size_t li, const float* y, float* out, int64_t n_seq, int64_t seq_len, const Ctx& ctx) {
    const LayerWeights& lw = w_.layers[li];
    const int64_t T = n_seq * seq_len, H = cfg_.hidden_size, hd = cfg_.head_dim();
    const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
    const float eps = float(cfg_.norm_eps);
    float* q = grow(q_, T * nh * hd);
    float* k = grow(k_, T * nkv * hd);
    float* v = grow(v_, T * nkv * hd);
    float* o = grow(o_, T * nh * hd);
    const int64_t* pos = ctx.kind == Ctx::kDecode ? ctx.pos : positions(n_seq, seq_len);
    cpu::linear(q, y, lw.q_proj.data(), T, H, nh * hd, n_threads_);
    cpu::linear(k, y, lw.k_proj.data(), T, H, nkv * hd, n_threads_);
    cpu::linear(v, y, lw.v_proj.data(), T, H, nkv * hd, n_threads_);
    cpu::rmsnorm(q, q, lw.q_layernorm.data(), T * nh, hd, eps, n_threads_);
    cpu::rmsnorm(k, k, lw.k_layernorm.data(), T * nkv, hd, eps, n_threads_);
    cpu::rope(q, q, pos, inv_freq_.data(), T, nh, hd, n_threads_);
    cpu::rope(k, k, pos, inv_freq_.data(), T, nkv, hd, n_threads_);
    const float scale = float(std::pow(double(hd), -0.5));  // HF: head_dim**-0.5, applied in fp32
    if (ctx.kind != Ctx::kPlain) {
      LayerState& st = state_[li];
      const int64_t kv = nkv * hd;
      for (int64_t r = 0; r < T; ++r) {  // (sequence, position) of row r
        const int64_t s = ctx.first_seq + r / seq_len, p = ctx.kind == Ctx::kDecode ? pos[r] : r % seq_len;
        std::copy(k + r * kv, k + (r + 1) * kv, st.k.begin() + (s * max_len_ + p) * kv);
        std::copy(v + r * kv, v + (r + 1) * kv, st.v.begin() + (s * max_len_ + p) * kv);
      }
    }
    if (ctx.kind == Ctx::kDecode) {
      LayerState& st = state_[li];
      float* scratch = grow(attn_scratch_, cpu::attention_scratch_floats(max_len_, n_threads_));
      cpu::attention_decode(o, q, st.k.data(), st.v.data(), ctx.first_seq, n_seq, pos, max_len_, nh, nkv, hd, scale,
                            scratch, n_threads_);
    } else {
      float* scratch = grow(attn_scratch_, cpu::attention_scratch_floats(seq_len, n_threads_));
      cpu::attention(o, q, k, v, n_seq, seq_len, nh, nkv, hd, scale, scratch, n_threads_);
    }
    cpu::linear(out, o, lw.out_proj.data(), T, nh * hd, H, n_threads_);
  }

  // out = out_proj(C * conv(B * x)), HF Lfm2MoeShortConv. Prefill also keeps each sequence's last
  // conv inputs (at the end of its own prompt); decode convolves with them and shifts them.
  void conv_block(size_t li, const float* y, float* out, int64_t n_seq, int64_t seq_len, const Ctx& ctx) {
    const LayerWeights& lw = w_.layers[li];
    const int64_t T = n_seq * seq_len, H = cfg_.hidden_size, L = cfg_.conv_L_cache;
    float* bcx = grow(q_, T * 3 * H);
    float* z = grow(o_, T * H);
    cpu::linear(bcx, y, lw.conv_in_proj.data(), T, H, 3 * H, n_threads_);
    if (ctx.kind == Ctx::kDecode) {
      cpu::short_conv_decode(z, bcx, lw.conv.data(), state_[li].conv.data() + ctx.first_seq * (L - 1) * H, ctx.pos,
                             n_seq, H, L, n_threads_);
    } else {
      cpu::short_conv(z, bcx, lw.conv.data(), n_seq, seq_len, H, L, n_threads_);
    }
    if (ctx.kind == Ctx::kPrefill)
      for (int64_t s = 0; s < n_seq; ++s)
        cpu::short_conv_state(state_[li].conv.data() + (ctx.first_seq + s) * (L - 1) * H, bcx + s * seq_len * 3 * H,
                              lengths_[size_t(ctx.first_seq + s)], H, L);
    cpu::linear(out, z, lw.conv_out_proj.data(), T, H, H, n_threads_);
  }

  // out = w2(silu(w1 f) * w3 f), HF Lfm2MoeMLP.
  void dense_block(const LayerWeights& lw, const float* f, float* out, int64_t T) {
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    float* g = grow(q_, T * I);
    float* u = grow(k_, T * I);
    cpu::linear(g, f, lw.w1.data(), T, H, I, n_threads_);
    cpu::linear(u, f, lw.w3.data(), T, H, I, n_threads_);
    cpu::swiglu(g, g, u, T * I, n_threads_);
    cpu::linear(out, g, lw.w2.data(), T, I, H, n_threads_);
  }

  // out = routed experts of f, HF Lfm2MoeSparseMoeBlock; rows flagged in done (or none) get nothing.
  void moe_block(const LayerWeights& lw, const float* f, float* out, int64_t T, const float* done) {
    const int64_t H = cfg_.hidden_size, E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
    const int64_t top_k = cfg_.num_experts_per_tok;
    float* logits = grow(q_, T * E);
    cpu::linear(logits, f, lw.gate.data(), T, H, E, n_threads_);
    std::vector<float>& rw = v_;
    grow(rw, T * top_k);
    if (int64_t(picked_.size()) < T * top_k) picked_.resize(size_t(T * top_k));
    cpu::moe_router(rw.data(), picked_.data(), logits, lw.expert_bias.empty() ? nullptr : lw.expert_bias.data(), T, E,
                    top_k, cfg_.norm_topk_prob, float(cfg_.routed_scaling_factor), n_threads_);
    if (done) cpu::moe_drop_rows(picked_.data(), done, T, top_k);
    const auto need = cpu::moe_experts_scratch(T, H, E, Im, top_k, n_threads_);
    float* fs = grow(moe_scratch_, need.floats);
    if (int64_t(moe_int_scratch_.size()) < need.ints) moe_int_scratch_.resize(size_t(need.ints));
    cpu::moe_experts(out, f, lw.experts_w1.data(), lw.experts_w3.data(), lw.experts_w2.data(), picked_.data(),
                     rw.data(), T, H, E, Im, top_k, fs, moe_int_scratch_.data(), n_threads_);
  }

  // Positions 0..seq_len-1 of every sequence, row-major (n_seq, seq_len).
  int64_t* positions(int64_t n_seq, int64_t seq_len) {
    pos_.resize(size_t(n_seq * seq_len));
    for (int64_t r = 0; r < n_seq * seq_len; ++r) pos_[size_t(r)] = r % seq_len;
    return pos_.data();
  }

  ModelWeights w_;
  const ModelConfig& cfg_;
  int n_threads_;
  std::vector<float> inv_freq_;  // (hd/2)
  std::vector<std::unique_ptr<float[]>> buffers_;
  std::vector<std::unique_ptr<char[]>> host_;  // alloc_host()
  std::vector<std::unique_ptr<int32_t[]>> tokens_;  // alloc_tokens()
  // Generation state (alloc_state).
  std::vector<LayerState> state_;
  int64_t max_len_ = 0;
  std::vector<int32_t> lengths_;
  SamplingParams sampling_;
  std::vector<int32_t> ended_;  // last stage: per sequence, the EOS id it produced (cpu::kNotEnded: none yet)
  // Scratch, grown on demand and reused by every layer.
  std::vector<float> y_, mix_, q_, k_, v_, o_, attn_scratch_, moe_scratch_, head_logits_;
  std::vector<int32_t> picked_, moe_int_scratch_;
  std::vector<int64_t> pos_;
};

}  // namespace

std::unique_ptr<StageExecutor> make_cpu_stage(WeightReader& weights, const StageRange& range, int n_threads) {
  return std::make_unique<CpuStage>(weights, range, n_threads);
}

}  // namespace lfm2
