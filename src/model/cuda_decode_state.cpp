#include "model/cuda_decode_state.h"

#include <algorithm>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/ops.h"

namespace lfm2 {

template <typename T>
typename DecodeState<T>::Offsets DecodeState<T>::plan(DeviceBlocks& blocks, const ModelConfig& cfg,
                                                      const std::vector<DeviceLayerWeights<T>>& layers,
                                                      int64_t n_seq, int64_t max_len) {
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim(), L = cfg.conv_L_cache, H = cfg.hidden_size;
  Offsets o;
  for (const DeviceLayerWeights<T>& lw : layers) {
    const bool attn = lw.is_attention;
    o.k.push_back(attn ? blocks.reserve(n_seq * max_len * kv * int64_t(sizeof(T))) : -1);
    o.v.push_back(attn ? blocks.reserve(n_seq * max_len * kv * int64_t(sizeof(T))) : -1);
    o.conv.push_back(attn ? -1 : blocks.reserve(n_seq * (L - 1) * H * int64_t(sizeof(float))));
  }
  o.lengths = blocks.reserve(n_seq * 4);
  o.ended = blocks.reserve(n_seq * 4);
  o.eos = blocks.reserve(64 * 4);
  return o;
}

template <typename T>
int64_t DecodeState<T>::bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, int64_t n_seq,
                              int64_t max_len) {
  DeviceBlocks blocks;
  plan(blocks, cfg, layers, n_seq, max_len);
  return blocks.bytes();
}

template <typename T>
void DecodeState<T>::init() {
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&at_), 2 * sizeof(int64_t)));
}

template <typename T>
void DecodeState<T>::allocate(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, int64_t n_seq,
                              int64_t max_len, const int32_t* lengths, const SamplingParams& sampling, int device) {
  LFM2_CHECK(int64_t(sampling.eos.size()) <= 64, "cuda stage: at most 64 end-of-sequence ids");
  release();
  const Offsets o = plan(memory_, cfg, layers, n_seq, max_len);
  memory_.allocate(cat("the generation state (KV cache and conv state) of ", n_seq, " sequences x ", max_len,
                       " positions"),
                   device);
  for (size_t li = 0; li < layers.size(); ++li)
    layers_.push_back(Layer{memory_.at<T>(o.k[li]), memory_.at<T>(o.v[li]), memory_.at<float>(o.conv[li])});
  lengths_ = memory_.at<int32_t>(o.lengths);
  ended_ = memory_.at<int32_t>(o.ended);
  eos_ = memory_.at<int32_t>(o.eos);
  CUDA_CHECK(cudaMemcpy(lengths_, lengths, size_t(n_seq) * 4, cudaMemcpyHostToDevice));
  if (!sampling.eos.empty())
    CUDA_CHECK(cudaMemcpy(eos_, sampling.eos.data(), sampling.eos.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(ended_, 0xff, size_t(n_seq) * 4));  // -1: cpu::kNotEnded
  host_lengths_.assign(lengths, lengths + n_seq);
  host_ended_.assign(size_t(n_seq), cpu::kNotEnded);
  n_seq_ = n_seq;
  max_len_ = max_len;
  sampling_ = sampling;
}

template <typename T>
void DecodeState<T>::release() {
  memory_.release();
  layers_.clear();
  lengths_ = ended_ = eos_ = nullptr;
  n_seq_ = max_len_ = 0;
  host_lengths_.clear();
  host_ended_.clear();
  sampling_ = SamplingParams{};
  host_logits_ = nullptr;
}

template <typename T>
DecodeState<T>::~DecodeState() {
  release();
  if (at_) cudaFree(at_);
}

template <typename T>
void DecodeState<T>::check(int64_t first_seq, int64_t n_seq, int64_t seq_len) const {
  LFM2_CHECK(memory_.allocated(), "cuda stage: generation before alloc_state()");
  LFM2_CHECK(first_seq >= 0 && first_seq + n_seq <= n_seq_ && seq_len <= max_len_, "cuda stage: sequences [",
             first_seq, ", ", first_seq + n_seq, ") of ", seq_len, " tokens outside the state of ", n_seq_, " x ",
             max_len_);
}

template <typename T>
void DecodeState<T>::check_decode(int64_t first_seq, int64_t n_seq, int64_t step) const {
  check(first_seq, n_seq, 1);
  for (int64_t i = 0; i < n_seq; ++i)
    LFM2_CHECK(host_lengths_[size_t(first_seq + i)] + step - 1 < max_len_, "cuda stage: decode step ", step,
               " of sequence ", first_seq + i, " reaches past the state's ", max_len_, " positions");
}

template <typename T>
void DecodeState<T>::restart(int64_t first_seq, int64_t n_seq, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(ended_ + first_seq, 0xff, size_t(n_seq) * 4, stream));
  std::fill(host_ended_.begin() + first_seq, host_ended_.begin() + first_seq + n_seq, cpu::kNotEnded);
}

template <typename T>
const int64_t* DecodeState<T>::set_step(int64_t first_seq, int64_t step, cudaStream_t stream) {
  cuda::set_decode_at(at_, first_seq, step, stream);
  return at_;
}

template <typename T>
void DecodeState<T>::finished_flags(float* flags, const int32_t* tokens, int64_t n, cudaStream_t stream) const {
  cuda::finished_flags(flags, tokens, n, eos_, int(sampling_.eos.size()), stream);
}

template <typename T>
void DecodeState<T>::choose_rows(int32_t* tokens, int32_t* host, const float* logits, int64_t r0, int64_t rows,
                                 int64_t first_seq, int64_t vocab, int32_t* top, float* margin, cudaStream_t stream) {
  if (!sampling_.greedy()) {
    CUDA_CHECK(cudaMemcpyAsync(host_logits_ + r0 * vocab, logits, size_t(rows * vocab) * 4, cudaMemcpyDeviceToHost,
                               stream));
    return;
  }
  cuda::argmax_margin(top, margin, logits, rows, vocab, stream);
  cuda::apply_eos(tokens + r0, top, rows, first_seq + r0, eos_, int(sampling_.eos.size()), ended_, stream);
  if (host) CUDA_CHECK(cudaMemcpyAsync(host + r0, tokens + r0, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream));
}

template <typename T>
void DecodeState<T>::choose_on_host(int32_t* tokens, int32_t* host, int64_t first_seq, int64_t n_seq, int64_t step,
                                    int64_t vocab, cudaStream_t stream) {
  if (sampling_.greedy()) return;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<int64_t> seq(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) seq[size_t(i)] = first_seq + i;
  std::vector<int32_t> chosen(static_cast<size_t>(n_seq));
  cpu::choose_tokens(chosen.data(), host_logits_, n_seq, vocab, seq.data(), step, sampling_, host_ended_.data(), 4);
  if (host) std::copy(chosen.begin(), chosen.end(), host);
  CUDA_CHECK(cudaMemcpy(tokens, chosen.data(), size_t(n_seq) * 4, cudaMemcpyHostToDevice));
}

template class DecodeState<float>;
template class DecodeState<__nv_bfloat16>;
template class DecodeState<__half>;

}  // namespace lfm2
