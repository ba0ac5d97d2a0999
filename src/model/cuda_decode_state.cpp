#include "model/cuda_decode_state.h"

#include <algorithm>
#include <numeric>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/ops.h"
#include "model/cuda_moe_fp8.h"

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
                                                      const StateShape& s, bool kv_fp8) {
  const int64_t kv = cfg.num_key_value_heads * cfg.head_dim(), L = cfg.conv_L_cache, H = cfg.hidden_size;
  const int64_t rows = s.n_pages * s.page_size;  // cache positions of the pool
  const int64_t pool = rows * kv * (kv_fp8 ? 1 : int64_t(sizeof(T)));
  const int64_t scales = kv_fp8 ? rows * cfg.num_key_value_heads * int64_t(sizeof(float)) : 0;
  Offsets o;
  bool any_moe = false, fp8_moe = false;
  for (const DeviceLayerWeights<T>& lw : layers) {
    const bool attn = lw.is_attention;
    o.k.push_back(attn ? blocks.reserve(pool) : -1);
    o.v.push_back(attn ? blocks.reserve(pool) : -1);
    o.ks.push_back(attn && scales ? blocks.reserve(scales) : -1);
    o.vs.push_back(attn && scales ? blocks.reserve(scales) : -1);
    o.conv.push_back(attn ? -1 : blocks.reserve(s.n_slots * (L - 1) * H * int64_t(sizeof(float))));
    any_moe = any_moe || lw.is_moe;
    fp8_moe = fp8_moe || lw.experts_w13_q;
  }
  const int64_t n = s.n_slots;
  o.table = blocks.reserve(n * s.max_pages * 4);
  o.step = blocks.reserve(n * kStepBytes);  // [PagedSeq][ends][fresh], one copy a step
  o.choice = CudaTokenChoice::reserve(blocks, n);
  o.attn_ws = blocks.reserve(cuda::attention_decode_paged_workspace_bytes(n, cfg.num_attention_heads, cfg.head_dim(),
                                                                          s.max_positions()));
  const int64_t et = sizeof(T);
  const int64_t moe_ws = fp8_moe ? moe_fp8_decode_scratch_bytes(n, moe_dims(cfg), et)
                                 : cuda::moe_decode_scratch_bytes(n, moe_dims(cfg), et);
  o.moe_ws = any_moe ? blocks.reserve(moe_ws) : -1;
  return o;
}

template <typename T>
int64_t DecodeState<T>::page_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                                   int64_t page_size) const {
  int64_t n = 0;
  for (const DeviceLayerWeights<T>& lw : layers) n += lw.is_attention ? 2 : 0;
  const int64_t nkv = cfg.num_key_value_heads, hd = cfg.head_dim();
  // a position of one KV head: hd elements of T, or hd e4m3 bytes and an fp32 scale
  const int64_t head = kv_fp8_ ? hd + int64_t(sizeof(float)) : hd * int64_t(sizeof(T));
  return n * page_size * nkv * head;
}

template <typename T>
int64_t DecodeState<T>::slot_bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers) const {
  DeviceBlocks one, two;
  const StateShape a{1, 1, kMinPageSize, 1}, b{2, 1, kMinPageSize, 1};
  plan(one, cfg, layers, a, kv_fp8_);
  plan(two, cfg, layers, b, kv_fp8_);
  return two.bytes() - one.bytes();  // conv state, table and descriptors, token choice, workspaces (rounded)
}

template <typename T>
int64_t DecodeState<T>::bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                              const StateShape& shape) const {
  DeviceBlocks blocks;
  plan(blocks, cfg, layers, shape, kv_fp8_);
  return blocks.bytes();
}

template <typename T>
void DecodeState<T>::allocate(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                              const StateShape& s, const SamplingParams& sampling, int device) {
  LFM2_CHECK(int64_t(sampling.eos.size()) <= CudaTokenChoice::kMaxEos, "cuda stage: at most ",
             CudaTokenChoice::kMaxEos, " end-of-sequence ids");
  LFM2_CHECK(valid_page_size(s.page_size), "cuda stage: page size ", s.page_size, " is not a power of two in [",
             kMinPageSize, ", ", kMaxPageSize, "]");
  LFM2_CHECK(s.n_slots >= 1 && s.n_pages >= 1 && s.max_pages >= 1 && s.n_slots < (int64_t(1) << 31) &&
                 s.max_positions() < (int64_t(1) << 31) && s.n_pages <= s.max_pool_pages(),
             "cuda stage: a generation state of ", s.n_slots, " slots, ", s.n_pages, " pages, ", s.max_pages,
             " pages a slot (a pool holds fewer than 2^31 positions)");
  release();
  const Offsets o = plan(memory_, cfg, layers, s, kv_fp8_);
  check_fits(s, device);
  memory_.allocate(cat("the generation state of ", s.n_slots, " sequences (", s.n_pages, " KV pages of ",
                       s.page_size, " positions)"),
                   device);
  CUDA_CHECK(cudaMemset(memory_.base(), 0, size_t(memory_.bytes())));
  bind(o, layers.size(), s.n_slots);
  CUDA_CHECK(cudaMemset(table_, 0xff, size_t(s.n_slots * s.max_pages) * 4));  // -1: no page
  choice_.bind(memory_, o.choice, s.n_slots, sampling, &staging_);
  staging_.allocate(std::max<int64_t>(s.n_slots * kStepBytes, s.max_pages * 4), device);
  host_desc_.assign(size_t(s.n_slots * kStepBytes), 0);
  host_table_.assign(size_t(s.n_slots * s.max_pages), -1);
  shape_ = s;
  old_ = OldCalls{{}, s.max_positions()};
  CUDA_CHECK(cudaDeviceSynchronize());  // the memsets ran on the legacy stream; steps queue on another
}

template <typename T>
void DecodeState<T>::check_fits(const StateShape& s, int device) {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t need = memory_.bytes();
  if (need <= int64_t(free_b)) return;
  memory_.release();
  LFM2_FAIL("the generation state (", s.n_slots, " sequences, ", s.n_pages, " KV pages of ", s.page_size,
            " positions: KV cache, conv state, decode workspaces) needs ", need >> 20, " MiB on device ", device,
            ", ", free_b >> 20, " MiB of ", total_b >> 20, " MiB are free (fewer sequences, shorter prompts or "
            "fewer new tokens)");
}

template <typename T>
void DecodeState<T>::bind(const Offsets& o, size_t n_layers, int64_t n_slots) {
  for (size_t li = 0; li < n_layers; ++li) {
    Layer l;
    l.conv = memory_.at<float>(o.conv[li]);
    if (kv_fp8_) {
      l.k8 = memory_.at<uint8_t>(o.k[li]), l.v8 = memory_.at<uint8_t>(o.v[li]);
      l.k_scale = memory_.at<float>(o.ks[li]), l.v_scale = memory_.at<float>(o.vs[li]);
    } else {
      l.k = memory_.at<T>(o.k[li]), l.v = memory_.at<T>(o.v[li]);
    }
    layers_.push_back(l);
  }
  table_ = memory_.at<int32_t>(o.table);
  seqs_ = memory_.at<PagedSeq>(o.step);
  ends_ = reinterpret_cast<int32_t*>(seqs_ + n_slots);
  fresh_ = ends_ + n_slots;
  attn_ws_ = memory_.at<void>(o.attn_ws);
  moe_ws_ = memory_.at<void>(o.moe_ws);
}

template <typename T>
void DecodeState<T>::allocate_old(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                                  int64_t n_seq, int64_t max_len, const int32_t* lengths,
                                  const SamplingParams& sampling, int device) {
  allocate(cfg, layers, old_state_shape(n_seq, max_len), sampling, device);
  std::iota(host_table_.begin(), host_table_.end(), 0);  // slot i: pages i * max_pages ..
  CUDA_CHECK(cudaMemcpy(table_, host_table_.data(), host_table_.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // the pageable copy's DMA, before the non-blocking stream reads
  old_ = OldCalls{std::vector<int32_t>(lengths, lengths + n_seq), max_len};
}

template <typename T>
void DecodeState<T>::release() {
  if (memory_.allocated()) cudaDeviceSynchronize();  // queued steps may still use it
  choice_.release();
  staging_.release();
  memory_.release();
  layers_.clear();
  table_ = ends_ = fresh_ = nullptr;
  seqs_ = nullptr;
  attn_ws_ = moe_ws_ = nullptr;
  shape_ = StateShape{};
  host_table_.clear();
  host_desc_.clear();
  old_ = OldCalls{};
}

template <typename T>
void DecodeState<T>::map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n, cudaStream_t stream) {
  LFM2_CHECK(allocated(), "cuda stage: map_pages() before alloc_batch_state()");
  check_map_pages(shape_, slot, first, pages, n, "cuda stage");
  std::copy(pages, pages + n, host_table_.begin() + slot * shape_.max_pages + first);
  staging_.copy(table_ + slot * shape_.max_pages + first, pages, n * 4, stream);
}

template <typename T>
void DecodeState<T>::check(const StepLayout& step) const {
  LFM2_CHECK(allocated(), "cuda stage: generation before its state is allocated");
  LFM2_CHECK(step.n_seqs() <= shape_.n_slots, "cuda stage: a step of ", step.n_seqs(), " sequences, the state has ",
             shape_.n_slots, " slots");
  check_step_pages(step, shape_, host_table_.data(), "cuda stage");
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
  StepDevice d;
  d.seqs = seqs_, d.ends = ends_, d.fresh = fresh_;
  d.n_seqs = n, d.n_decode = step.n_decode, d.rows = step.rows, d.max_prompt_rows = step.max_prompt_rows;
  d.n_fresh = n_fresh;
  d.done = done;
  return d;
}

template class DecodeState<float>;
template class DecodeState<__nv_bfloat16>;
template class DecodeState<__half>;

}  // namespace lfm2
