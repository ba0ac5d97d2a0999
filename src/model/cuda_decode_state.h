// Generation's state on the GPU (SPEC §3 "Generation"), in one device allocation: for each layer of
// the stage the KV cache (attention layers, compute dtype) or the conv state (conv layers, fp32) of
// every sequence, the prompt lengths, the EOS id each sequence ended with (last stage) and the EOS
// ids; and the last stage's token choice: greedy on the device (argmax, then the EOS rule), sampling
// on the host (cpu::choose_tokens on a pinned copy of the logits: the CPU's exact rule).
//
// A sequence's state is found by its index (its slot); today a microbatch holds the consecutive
// slots first_seq.. and a decode step finds each row's position from the prompt lengths and the
// step. A step that mixes prefill chunks and decode rows of any slots (issues 20 and 26) changes
// how rows are described (CudaLayers::StepRows) and what this room keeps per slot (positions, a
// paged cache's block table), not the layer loop's shape.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "io/model_config.h"
#include "kernels/sample.h"
#include "model/cuda_memory.h"
#include "model/cuda_weights.h"

namespace lfm2 {

template <typename T>
class DecodeState {
 public:
  // One layer's state of every sequence.
  struct Layer {
    T *k = nullptr, *v = nullptr;  // attention: (N, max_len, nkv * hd)
    float* conv = nullptr;         // conv: (N, L - 1, H), u = B * x of the last positions
  };

  DecodeState() = default;
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;
  ~DecodeState();

  // Bytes allocate() takes for n_seq sequences of at most max_len positions.
  static int64_t bytes(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, int64_t n_seq,
                       int64_t max_len);
  // The device copy of a decode step's (first_seq, step), kept for the stage's lifetime.
  void init();
  // lengths (n_seq, host): the prompt lengths; sampling: how the last stage chooses tokens.
  void allocate(const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers, int64_t n_seq,
                int64_t max_len, const int32_t* lengths, const SamplingParams& sampling, int device);
  // Where the last stage samples: pinned host memory for (microbatch, V) logits.
  void set_host_logits(float* host_logits) { host_logits_ = host_logits; }
  void release();  // the state; init()'s copy lives on until the destructor

  const Layer& layer(size_t li) const { return layers_[li]; }
  const int32_t* lengths() const { return lengths_; }  // device, per sequence
  int64_t max_len() const { return max_len_; }

  // Sequences [first_seq, first_seq + n_seq) of seq_len positions fit the state.
  void check(int64_t first_seq, int64_t n_seq, int64_t seq_len) const;
  // And their decode step `step` stays inside max_len.
  void check_decode(int64_t first_seq, int64_t n_seq, int64_t step) const;
  // Last stage, after a prefill: the sequences have not ended (device and host).
  void restart(int64_t first_seq, int64_t n_seq, cudaStream_t stream);
  // Writes (first_seq, step) to the device in stream order, for a graph's kernels; returns it.
  const int64_t* set_step(int64_t first_seq, int64_t step, cudaStream_t stream);
  // flags (n) = 1 where tokens (n, device) is an EOS id of the sampling (cuda::finished_flags).
  void finished_flags(float* flags, const int32_t* tokens, int64_t n, cudaStream_t stream) const;

  // Token choice for rows [r0, r0 + rows) of a microbatch whose first sequence is first_seq, from
  // their logits (rows, vocab) on the device. Greedy: argmax into top and margin (rows), the EOS
  // rule into tokens + r0 (device), copied to host + r0 (pinned, or null). Sampling: the logits go
  // to the pinned copy for choose_on_host().
  void choose_rows(int32_t* tokens, int32_t* host, const float* logits, int64_t r0, int64_t rows, int64_t first_seq,
                   int64_t vocab, int32_t* top, float* margin, cudaStream_t stream);
  // Sampling: waits for the logits, draws every row (cpu::choose_tokens) and writes the tokens to
  // host and device. Greedy: nothing.
  void choose_on_host(int32_t* tokens, int32_t* host, int64_t first_seq, int64_t n_seq, int64_t step, int64_t vocab,
                      cudaStream_t stream);

 private:
  struct Offsets {
    std::vector<int64_t> k, v, conv;  // per layer, -1 where the layer has none
    int64_t lengths = 0, ended = 0, eos = 0;
  };
  static Offsets plan(DeviceBlocks& blocks, const ModelConfig& cfg, const std::vector<DeviceLayerWeights<T>>& layers,
                      int64_t n_seq, int64_t max_len);

  DeviceBlocks memory_;
  std::vector<Layer> layers_;  // per layer of the stage
  int32_t* lengths_ = nullptr; // (N) prompt lengths
  int32_t* ended_ = nullptr;   // (N) last stage: the EOS id each produced, -1 before
  int32_t* eos_ = nullptr;     // the EOS ids (at most 64)
  int64_t n_seq_ = 0, max_len_ = 0;
  std::vector<int32_t> host_lengths_;
  std::vector<int32_t> host_ended_;  // sampling: the EOS ids the host keeps
  SamplingParams sampling_;
  float* host_logits_ = nullptr;     // sampling: pinned (microbatch, V)
  int64_t* at_ = nullptr;            // (2) a decode step's (first_seq, step), for graph replays
};

}  // namespace lfm2
