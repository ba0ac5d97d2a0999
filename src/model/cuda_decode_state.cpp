#include "model/cuda_decode_state.h"

#include <algorithm>
#include <numeric>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/ops.h"

namespace lfm2 {
namespace {

cuda::MoeDims moe_dims(const ModelConfig& cfg) {
  return {cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.num_experts_per_tok, cfg.norm_topk_prob,
          float(cfg.routed_scaling_factor)};
}

}  // namespace

template <typename T>
typename DecodeState<T>::Offsets DecodeState<T>::plan(DeviceBlocks& blocks, const ModelConfig& cfg,
                                                      const std::vector<DeviceLayerWeights<T>>& layers,
                                                      const StateShape& s) {
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim(), L = cfg.conv_L_cache, H = cfg.hidden_size;
  const int64_t pool = s.n_pages * s.page_size * kv * int64_t(sizeof(T));
  Offsets o;
  bool any_moe = false;
  for (const DeviceLayerWeights<T>& lw : layers) {
    const bool attn = lw.is_attention;
    o.k.push_back(attn ? blocks.reserve(pool) : -1);
    o.v.push_back(attn ? blocks.reserve(pool) : -1);
    o.conv.push_back(attn ? -1 : blocks.reserve(s.n_slots * (L - 1) * H * int64_t(sizeof(float))));
    any_moe = any_moe || lw.is_moe;
  }
  const int64_t n = s.n_slots;
  o.table = blocks.reserve(n * s.max_pages * 4);
  o.ended = blocks.reserve(n * 4);
  o.eos = blocks.reserve(64 * 4);
  o.step = blocks.reserve(n * kStepBytes);  // [PagedSeq][ends][fresh], one copy a step
  o.emits = blocks.reserve(n * 8);          // [rows][slots]
  o.attn_ws = blocks.reserve(cuda::attention_decode_paged_workspace_bytes(n, cfg.num_attention_heads, cfg.head_dim(),
                                                                          s.max_positions()));
  o.moe_ws = any_moe ? blocks.reserve(cuda::moe_decode_scratch_bytes(n, moe_dims(cfg), int64_t(sizeof(T)))) : -1;
  return o;
}

template <typename T>
int64_t DecodeState<T>::page_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                                   int64_t page_size) {
  int64_t n = 0;
  for (const DeviceLayerWeights<T>& lw : layers) n += lw.is_attention ? 2 : 0;
  return n * page_size * cfg.num_key_value_heads * cfg.head_dim() * int64_t(sizeof(T));
}

template <typename T>
int64_t DecodeState<T>::slot_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers) {
  DeviceBlocks one, two;
  const StateShape a{1, 1, kMinPageSize, 1}, b{2, 1, kMinPageSize, 1};
  plan(one, cfg, layers, a);
  plan(two, cfg, layers, b);
  return two.bytes() - one.bytes();  // conv state, EOS state, table and descriptors, workspaces (rounded)
}

template <typename T>
int64_t DecodeState<T>::bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                              const StateShape& shape) {
  DeviceBlocks blocks;
  plan(blocks, cfg, layers, shape);
  return blocks.bytes();
}

template <typename T>
void DecodeState<T>::allocate(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                              const StateShape& s, const SamplingParams& sampling, int device) {
  LFM2_CHECK(int64_t(sampling.eos.size()) <= 64, "cuda stage: at most 64 end-of-sequence ids");
  LFM2_CHECK(s.n_slots >= 1 && s.n_pages >= 1 && s.max_pages >= 1 && s.n_slots < (int64_t(1) << 31) &&
                 s.max_positions() < (int64_t(1) << 31),
             "cuda stage: a generation state of ", s.n_slots, " slots, ", s.n_pages, " pages, ", s.max_pages,
             " pages a slot");
  LFM2_CHECK(valid_page_size(s.page_size), "cuda stage: page size ", s.page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  release();
  const Offsets o = plan(memory_, cfg, layers, s);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t need = memory_.bytes();
  if (need > int64_t(free_b)) {
    memory_.release();
    LFM2_FAIL("the generation state (", s.n_slots, " sequences, ", s.n_pages, " KV pages of ", s.page_size,
              " positions: KV cache, conv state, decode workspaces) needs ", need >> 20, " MiB on device ", device,
              ", ", free_b >> 20, " MiB of ", total_b >> 20, " MiB are free (fewer sequences, shorter prompts or "
              "fewer new tokens)");
  }
  memory_.allocate(cat("the generation state of ", s.n_slots, " sequences (", s.n_pages, " KV pages of ",
                       s.page_size, " positions)"),
                   device);
  CUDA_CHECK(cudaMemset(memory_.base(), 0, size_t(need)));
  for (size_t li = 0; li < layers.size(); ++li)
    layers_.push_back(Layer{memory_.at<T>(o.k[li]), memory_.at<T>(o.v[li]), memory_.at<float>(o.conv[li])});
  table_ = memory_.at<int32_t>(o.table);
  ended_ = memory_.at<int32_t>(o.ended);
  eos_ = memory_.at<int32_t>(o.eos);
  seqs_ = memory_.at<PagedSeq>(o.step);
  ends_ = reinterpret_cast<int32_t*>(seqs_ + s.n_slots);
  fresh_ = ends_ + s.n_slots;
  emit_rows_ = memory_.at<int32_t>(o.emits);
  emit_slots_ = emit_rows_ + s.n_slots;
  attn_ws_ = memory_.at<void>(o.attn_ws);
  moe_ws_ = memory_.at<void>(o.moe_ws);
  CUDA_CHECK(cudaMemset(table_, 0xff, size_t(s.n_slots * s.max_pages) * 4));  // -1: no page
  CUDA_CHECK(cudaMemset(ended_, 0xff, size_t(s.n_slots) * 4));                // -1: cpu::kNotEnded
  if (!sampling.eos.empty())
    CUDA_CHECK(cudaMemcpy(eos_, sampling.eos.data(), sampling.eos.size() * 4, cudaMemcpyHostToDevice));
  staging_.allocate(std::max<int64_t>(s.n_slots * kStepBytes, s.max_pages * 4), device);
  host_desc_.assign(size_t(s.n_slots * kStepBytes), 0);
  host_table_.assign(size_t(s.n_slots * s.max_pages), -1);
  host_ended_.assign(size_t(s.n_slots), cpu::kNotEnded);
  shape_ = s;
  sampling_ = sampling;
  device_ = device;
  max_len_ = s.max_positions();
  CUDA_CHECK(cudaDeviceSynchronize());  // the memsets ran on the legacy stream; steps queue on another
}

template <typename T>
void DecodeState<T>::allocate_old(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                                  int64_t n_seq, int64_t max_len, const int32_t* lengths,
                                  const SamplingParams& sampling, int device) {
  allocate(cfg, layers, old_state_shape(n_seq, max_len), sampling, device);
  std::iota(host_table_.begin(), host_table_.end(), 0);  // slot i: pages i * max_pages ..
  CUDA_CHECK(cudaMemcpy(table_, host_table_.data(), host_table_.size() * 4, cudaMemcpyHostToDevice));
  host_lengths_.assign(lengths, lengths + n_seq);
  max_len_ = max_len;
}

template <typename T>
void DecodeState<T>::release() {
  if (memory_.allocated()) cudaDeviceSynchronize();  // queued steps may still use it
  staging_.release();
  memory_.release();
  layers_.clear();
  table_ = ended_ = eos_ = ends_ = fresh_ = emit_rows_ = emit_slots_ = nullptr;
  seqs_ = nullptr;
  attn_ws_ = moe_ws_ = nullptr;
  shape_ = StateShape{};
  host_table_.clear();
  host_ended_.clear();
  host_lengths_.clear();
  host_desc_.clear();
  sampling_ = SamplingParams{};
  host_logits_ = nullptr;
  host_logit_rows_ = 0;
  max_len_ = 0;
}

template <typename T>
void DecodeState<T>::map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n, cudaStream_t stream) {
  LFM2_CHECK(allocated(), "cuda stage: map_pages() before alloc_batch_state()");
  LFM2_CHECK(slot >= 0 && slot < shape_.n_slots && first >= 0 && n >= 0 && first + n <= shape_.max_pages,
             "cuda stage: map_pages(slot ", slot, ", pages ", first, "..", first + n - 1, ") outside ",
             shape_.n_slots, " slots of ", shape_.max_pages, " pages");
  for (int64_t i = 0; i < n; ++i)
    LFM2_CHECK(pages[i] >= 0 && pages[i] < shape_.n_pages, "cuda stage: map_pages(slot ", slot, "): page id ",
               pages[i], " outside the pool of ", shape_.n_pages);
  std::copy(pages, pages + n, host_table_.begin() + slot * shape_.max_pages + first);
  staging_.copy(table_ + slot * shape_.max_pages + first, pages, n * 4, stream);
}

template <typename T>
void DecodeState<T>::check(const StepLayout& step) const {
  LFM2_CHECK(allocated(), "cuda stage: generation before its state is allocated");
  LFM2_CHECK(step.n_seqs() <= shape_.n_slots, "cuda stage: a step of ", step.n_seqs(), " sequences, the state has ",
             shape_.n_slots, " slots");
  for (const PagedSeq& s : step.seqs) {
    const int64_t end = int64_t(s.first_pos) + s.n_rows;
    LFM2_CHECK(s.table_row >= 0 && s.table_row < shape_.n_slots && end <= shape_.max_positions(),
               "cuda stage: slot ", s.table_row, " at positions ", s.first_pos, "..", end - 1,
               " outside the state's ", shape_.n_slots, " slots of ", shape_.max_positions(), " positions");
    for (int64_t lp = 0; lp * shape_.page_size < end; ++lp)
      LFM2_CHECK(host_table_[size_t(s.table_row * shape_.max_pages + lp)] >= 0, "cuda stage: slot ", s.table_row,
                 " has no page for positions from ", lp * shape_.page_size, " (map_pages)");
  }
}

template <typename T>
StepDevice DecodeState<T>::upload(const StepLayout& step, const float* done, cudaStream_t stream) {
  const int64_t n = step.n_seqs();
  const int64_t N = shape_.n_slots, n_fresh = int64_t(step.fresh.size());
  char* h = host_desc_.data();
  std::copy(step.seqs.begin(), step.seqs.end(), reinterpret_cast<PagedSeq*>(h));
  std::copy(step.ends.begin(), step.ends.end(), reinterpret_cast<int32_t*>(h + N * 16));
  std::copy(step.fresh.begin(), step.fresh.end(), reinterpret_cast<int32_t*>(h + N * 20));
  staging_.copy(seqs_, h, n_fresh ? N * 20 + n_fresh * 4 : N * 16 + n * 4, stream);  // the used prefix
  return StepDevice{seqs_, ends_, n, step.n_decode, step.rows, step.max_prompt_rows, done};
}

template <typename T>
void DecodeState<T>::restart(const StepLayout& step, cudaStream_t stream) {
  cuda::restart_ended(ended_, fresh_, int64_t(step.fresh.size()), stream);
}

template <typename T>
void DecodeState<T>::finished_flags(float* flags, const int32_t* tokens, int64_t n, cudaStream_t stream) const {
  cuda::finished_flags(flags, tokens, n, eos_, int(sampling_.eos.size()), stream);
}

template <typename T>
const int32_t* DecodeState<T>::upload_emits(const std::vector<StepEmit>& emits, cudaStream_t stream) {
  LFM2_CHECK(int64_t(emits.size()) <= shape_.n_slots, "cuda stage: ", emits.size(), " tokens to choose, ",
             shape_.n_slots, " slots");
  const int64_t N = shape_.n_slots, n = int64_t(emits.size());
  auto* h = reinterpret_cast<int32_t*>(host_desc_.data());
  for (int64_t i = 0; i < n; ++i) h[i] = int32_t(emits[size_t(i)].row + 1), h[N + i] = emits[size_t(i)].slot;
  staging_.copy(emit_rows_, h, (N + n) * 4, stream);  // [rows][slots], the used prefix
  return emit_rows_;
}

template <typename T>
bool DecodeState<T>::greedy(const std::vector<StepEmit>& emits, const SeqSampling* params) const {
  if (!params) return sampling_.greedy();
  for (size_t i = 0; i < emits.size(); ++i)
    if (params[i].temperature > 0 && params[i].top_k != 1) return false;
  return true;
}

template <typename T>
void DecodeState<T>::choose_rows(int32_t* tokens, int32_t* host, const float* logits, int64_t r0, int64_t rows,
                                 bool greedy, int64_t vocab, int32_t* top, float* margin, cudaStream_t stream) {
  if (!greedy) {
    LFM2_CHECK(host_logits_ && r0 + rows <= host_logit_rows_, "cuda stage: sampling ", r0 + rows,
               " rows, the pinned logits hold ", host_logit_rows_);
    CUDA_CHECK(cudaMemcpyAsync(host_logits_ + r0 * vocab, logits, size_t(rows * vocab) * 4, cudaMemcpyDeviceToHost,
                               stream));
    return;
  }
  cuda::argmax_margin(top, margin, logits, rows, vocab, stream);
  cuda::apply_eos(tokens + r0, top, rows, 0, eos_, int(sampling_.eos.size()), ended_, stream, emit_slots_ + r0);
  if (host) CUDA_CHECK(cudaMemcpyAsync(host + r0, tokens + r0, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream));
}

template <typename T>
void DecodeState<T>::choose_on_host(int32_t* tokens, int32_t* host, const std::vector<StepEmit>& emits,
                                    const SeqSampling* params, int64_t vocab, cudaStream_t stream) {
  // the device's EOS state is the truth: read it, draw, write it back
  CUDA_CHECK(cudaMemcpyAsync(host_ended_.data(), ended_, host_ended_.size() * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t n = int64_t(emits.size());
  std::vector<int32_t> chosen(static_cast<size_t>(n));
  choose_emitted(chosen.data(), host_logits_, vocab, emits, sampling_, params, host_ended_.data(), 4);
  if (host) std::copy(chosen.begin(), chosen.end(), host);
  CUDA_CHECK(cudaMemcpy(tokens, chosen.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(ended_, host_ended_.data(), host_ended_.size() * 4, cudaMemcpyHostToDevice));
}

template <typename T>
void DecodeState<T>::check_old(int64_t first_seq, int64_t n_seq, int64_t seq_len) const {
  LFM2_CHECK(!host_lengths_.empty(), "cuda stage: generation before alloc_state()");
  LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= int64_t(host_lengths_.size()) && seq_len <= max_len_,
             "cuda stage: sequences [", first_seq, ", ", first_seq + n_seq, ") of ", seq_len,
             " tokens outside the state of ", host_lengths_.size(), " x ", max_len_);
}

template <typename T>
std::vector<int64_t> DecodeState<T>::decode_positions(int64_t first_seq, int64_t n_seq, int64_t step) const {
  check_old(first_seq, n_seq, 1);
  std::vector<int64_t> pos(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) {
    pos[size_t(i)] = host_lengths_[size_t(first_seq + i)] + step - 1;
    LFM2_CHECK(pos[size_t(i)] < max_len_, "cuda stage: decode step ", step, " of sequence ", first_seq + i,
               " reaches past the state's ", max_len_, " positions");
  }
  return pos;
}

template class DecodeState<float>;
template class DecodeState<__nv_bfloat16>;
template class DecodeState<__half>;

}  // namespace lfm2
