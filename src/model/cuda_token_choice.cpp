#include "model/cuda_token_choice.h"

#include <algorithm>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/ops.h"
#include "model/cpu_token_choice.h"

namespace lfm2 {

CudaTokenChoice::~CudaTokenChoice() {
  if (host_logits_) cudaFreeHost(host_logits_);
}

CudaTokenChoice::Blocks CudaTokenChoice::reserve(DeviceBlocks& blocks, int64_t n_slots) {
  Blocks b;
  b.ended = blocks.reserve(n_slots * 4);
  b.eos = blocks.reserve(kMaxEos * 4);
  b.emits = blocks.reserve(n_slots * 8);  // [rows][slots]
  return b;
}

void CudaTokenChoice::bind(const DeviceBlocks& memory, const Blocks& blocks, int64_t n_slots,
                           const SamplingParams& sampling, StagingRing* staging) {
  ended_ = memory.at<int32_t>(blocks.ended);
  eos_ = memory.at<int32_t>(blocks.eos);
  emit_rows_ = memory.at<int32_t>(blocks.emits);
  emit_slots_ = emit_rows_ + n_slots;
  CUDA_CHECK(cudaMemset(ended_, 0xff, size_t(n_slots) * 4));  // -1: cpu::kNotEnded
  if (!sampling.eos.empty()) {
    CUDA_CHECK(cudaMemcpy(eos_, sampling.eos.data(), sampling.eos.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());  // the pageable copy's DMA, before the non-blocking stream reads
  }
  host_emits_.assign(size_t(2 * n_slots), 0);
  host_ended_.assign(size_t(n_slots), cpu::kNotEnded);
  n_slots_ = n_slots;
  sampling_ = sampling;
  staging_ = staging;
}

void CudaTokenChoice::release() {
  ended_ = eos_ = emit_rows_ = emit_slots_ = nullptr;
  host_emits_.clear();
  host_ended_.clear();
  n_slots_ = 0;
  sampling_ = SamplingParams{};
  staging_ = nullptr;
  host_logit_rows_ = 0;
}

void CudaTokenChoice::allow_sampling(int64_t rows, int64_t vocab, int device) {
  if (host_logit_capacity_ < rows) {
    if (host_logits_) cudaFreeHost(host_logits_);  // no copy into it is queued: the state was just made
    host_logits_ = nullptr;
    host_logit_capacity_ = 0;
    host_logits_ = static_cast<float*>(pinned_alloc(rows * vocab * 4, device));
    host_logit_capacity_ = rows;
  }
  host_logit_rows_ = host_logit_capacity_;
}

void CudaTokenChoice::finished_flags(float* flags, const int32_t* tokens, int64_t n, cudaStream_t stream) const {
  cuda::finished_flags(flags, tokens, n, eos_, int(sampling_.eos.size()), stream);
}

void CudaTokenChoice::restart(const int32_t* slots, int64_t n, cudaStream_t stream) {
  cuda::restart_ended(ended_, slots, n, stream);
}

const int32_t* CudaTokenChoice::upload_emits(const std::vector<StepEmit>& emits, cudaStream_t stream) {
  LFM2_CHECK(int64_t(emits.size()) <= n_slots_, "cuda stage: ", emits.size(), " tokens to choose, ", n_slots_,
             " slots");
  const int64_t N = n_slots_, n = int64_t(emits.size());
  int32_t* h = host_emits_.data();
  for (int64_t i = 0; i < n; ++i) h[i] = int32_t(emits[size_t(i)].row + 1), h[N + i] = emits[size_t(i)].slot;
  staging_->copy(emit_rows_, h, (N + n) * 4, stream);  // [rows][slots], the used prefix
  return emit_rows_;
}

bool CudaTokenChoice::greedy(const std::vector<StepEmit>& emits, const SeqSampling* params) const {
  if (!params) return sampling_.greedy();
  for (size_t i = 0; i < emits.size(); ++i)
    if (params[i].temperature > 0 && params[i].top_k != 1) return false;
  return true;
}

void CudaTokenChoice::choose_rows(int32_t* tokens, int32_t* host, const float* logits, int64_t r0, int64_t rows,
                                  bool greedy, int64_t vocab, int32_t* top, float* margin, cudaStream_t stream) {
  if (!greedy) {
    LFM2_CHECK(r0 + rows <= host_logit_rows_, "cuda stage: sampling ", r0 + rows, " rows, the pinned logits hold ",
               host_logit_rows_);
    CUDA_CHECK(cudaMemcpyAsync(host_logits_ + r0 * vocab, logits, size_t(rows * vocab) * 4, cudaMemcpyDeviceToHost,
                               stream));
    return;
  }
  cuda::argmax_margin(top, margin, logits, rows, vocab, stream);
  cuda::apply_eos(tokens + r0, top, rows, 0, eos_, int(sampling_.eos.size()), ended_, stream, emit_slots_ + r0);
  if (host) CUDA_CHECK(cudaMemcpyAsync(host + r0, tokens + r0, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream));
}

void CudaTokenChoice::choose_on_host(int32_t* tokens, int32_t* host, const std::vector<StepEmit>& emits,
                                     const SeqSampling* params, int64_t vocab, cudaStream_t stream) {
  // the device's EOS state is the truth: read it, draw, write it back
  CUDA_CHECK(cudaMemcpyAsync(host_ended_.data(), ended_, host_ended_.size() * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t n = int64_t(emits.size());
  std::vector<int32_t> chosen(static_cast<size_t>(n));
  choose_emitted(chosen.data(), host_logits_, vocab, emits, sampling_, params, host_ended_.data(), 4);
  if (host) std::copy(chosen.begin(), chosen.end(), host);
  // On the compute stream: a plain cudaMemcpy from pageable memory may return before its DMA lands,
  // and the compute stream (non-blocking) is not ordered after it; the next step would read a stale
  // token. cudaMemcpyAsync stages pageable memory before returning, so `chosen` may go.
  CUDA_CHECK(cudaMemcpyAsync(tokens, chosen.data(), size_t(n) * 4, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(ended_, host_ended_.data(), host_ended_.size() * 4, cudaMemcpyHostToDevice, stream));
}

}  // namespace lfm2
