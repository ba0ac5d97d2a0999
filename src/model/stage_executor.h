// The backend interface: one pipeline stage's compute, on the CPU (the oracle) or on a GPU.
//
// The pipeline (src/rank) owns the schedule and the transport; an executor owns its stage's
// weights and scratch memory and runs the math of SPEC §1 on a microbatch of n_seq sequences of
// seq_len tokens each (positions 0..seq_len-1, rows ordered sequence-major: row = s*seq_len + t).
// Hidden states are opaque buffers of n_seq*seq_len*hidden elements of act_dtype(), living where
// the backend computes (host memory for the CPU, device memory for CUDA).
#pragma once

#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "io/weight_file.h"
#include "kernels/sample.h"
#include "model/step_batch.h"

namespace lfm2 {

// Where head() leaves its results: host memory from alloc_host(), readable once the executor's
// queued work is done (synchronize()). Null pointers are not wanted and cost nothing.
struct HeadOutputs {
  int32_t* next_token = nullptr;  // (n_seq) top-1 of each sequence's last position (first maximum)
  float* margin = nullptr;        // (n_seq) its logit minus the runner-up's (0 on a tie)
  float* logits = nullptr;        // (n_seq, V) last position
  float* all_logits = nullptr;    // (n_seq * seq_len, V) every position
};

// Generation's decode step: the buffer holds n_seq fp32 rows of hidden states, then n_seq fp32
// finished flags (0 or 1). Needs act_dtype() F32, which both backends have.
inline float* decode_flags(void* x, int64_t n_seq, int64_t hidden) { return static_cast<float*>(x) + n_seq * hidden; }
inline int64_t decode_buffer_floats(int64_t n_seq, int64_t hidden) { return n_seq * (hidden + 1); }

class StageExecutor {
 public:
  virtual ~StageExecutor() = default;

  virtual DType act_dtype() const = 0;       // element type of hidden-state buffers
  virtual bool on_device() const = 0;        // buffers live in GPU memory
  virtual int64_t weight_bytes() const = 0;  // bytes of weights this stage holds

  // A hidden-state buffer for up to max_tokens tokens, owned by the executor. Allocate every
  // buffer before the first exchange.
  virtual void* alloc_hidden(int64_t max_tokens) = 0;
  // Host memory of `bytes` bytes that queued work may read and write asynchronously (pinned on a
  // GPU), owned by the executor.
  virtual void* alloc_host(int64_t bytes) = 0;

  // First stage: x = embed_tokens[ids]; ids (host memory from alloc_host) is [n_seq, seq_len],
  // already range-checked, and must stay unchanged until the queued work is done.
  virtual void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) = 0;
  // This stage's layers, in place on x.
  virtual void forward(void* x, int64_t n_seq, int64_t seq_len) = 0;
  // Last stage: final norm, LM head and the top-1 with its margin, into `out` (see HeadOutputs), at
  // each sequence's last position: lengths[s] - 1 (lengths: host memory from alloc_host, unchanged
  // until the queued work is done), or seq_len - 1 without lengths. next_token and margin are always
  // computed; the logits cross to the host only where asked.
  virtual void head(const void* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) = 0;
  // Blocks until queued work is done (a no-op on the CPU).
  virtual void synchronize() = 0;

  // ---- generation (SPEC §3 "Generation"): each sequence's state in this stage's layers, the KV
  // cache of its attention layers and the last conv_L_cache - 1 inputs of its conv layers.
  // Bytes alloc_state() takes for n_seq sequences of at most max_len positions.
  virtual int64_t state_bytes(int64_t n_seq, int64_t max_len) const;
  // Allocates the state once. lengths (n_seq, host) are the prompt lengths; sampling is how the
  // last stage chooses tokens.
  virtual void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& sampling);
  // Prefill: forward() of sequences [first_seq, first_seq + n_seq), x (n_seq * seq_len rows), that
  // also stores their state (the last stage also forgets whether they had finished).
  virtual void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len);
  // Decode step `step` (>= 1): x holds one token per sequence, each at position lengths[s] + step - 1;
  // reads and extends their state. After the n_seq rows, x holds n_seq finished flags
  // (decode_flags(); written by embed_tokens): a finished sequence is not routed to the experts,
  // and its row is unspecified afterwards (the last stage repeats its EOS whatever the row says).
  virtual void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step);
  // Token buffers the executor computes with (device memory on a GPU): alloc_tokens(n) of n ids.
  virtual int32_t* alloc_tokens(int64_t n);
  // First stage: x = embed_tokens[tokens], tokens from alloc_tokens(), and the finished flags after
  // the rows: 1 where the token is an EOS id of alloc_state()'s sampling (kernels/sample.h).
  virtual void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x);
  // Last stage: the token of step `step` of each sequence (SamplingParams) from x: its last position
  // (lengths[s] - 1 of seq_len rows) after the prefill, its one row after a decode step; into
  // tokens (alloc_tokens), and copied to host (alloc_host memory, readable after synchronize()).
  virtual void choose(const void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step,
                      int32_t* tokens, int32_t* host);
  // ---- generation in batches (model/step_batch.h; issues 20 and 26): any sequences of any slots
  // in one step, prompt chunks and decode rows mixed, the KV cache in pages. Executors implement
  // these beside the calls above until the engine has moved to them.
  // Bytes one KV page of page_size positions takes on this stage (every attention layer), and the
  // other state of one slot (conv state, EOS state): a pool's size is decided from these.
  virtual int64_t page_bytes(int64_t page_size) const;
  virtual int64_t slot_bytes() const;
  // Allocates the state once (refusing, with the bytes named, when it does not fit); `sampling`
  // holds the EOS ids and the defaults of every sequence.
  virtual void alloc_batch_state(const StateShape& shape, const SamplingParams& sampling);
  // Slot `slot`'s block-table entries [first, first + n) = pages[0..n) (host memory; page ids in
  // [0, n_pages)), in stream order: the steps queued after it see them.
  virtual void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n);
  // First stage: x = the embedding of every row: a prompt entry's rows from prompt_ids (alloc_host
  // memory: every prompt entry's n_rows ids, in entry order, range-checked; unchanged until the
  // queued work is done; null without prompt entries), a decode entry's row from fed (alloc_tokens
  // memory, or alloc_host memory that device kernels read through unified addressing, unchanged
  // until the queued work is done: one id per decode entry, in order; null without decode
  // entries); after the rows, one
  // fp32 finished flag per decode entry (decode_flags(x, b.rows(), hidden)'s first n_decode floats:
  // 1 where the fed token is an EOS id). So x needs alloc_hidden(rows + ceil(n_decode / hidden)).
  virtual void embed_batch(const StepBatch& b, const int32_t* prompt_ids, const int32_t* fed, void* x);
  // First stage: dst[0..n) = src[0..n) in stream order (the steps queued after it see it): dst
  // alloc_tokens memory, src alloc_tokens or alloc_host memory (unchanged until the queued work is
  // done). How a continuous step's fed tokens are gathered from an earlier step's chosen tokens
  // (still on the device) and the host's. Host executors: a memcpy.
  virtual void copy_tokens(int32_t* dst, const int32_t* src, int64_t n);
  // This stage's layers on x (b.rows() rows, then the flags), reading and extending each entry's
  // slot: prompt entries store their positions' state, decode entries read it and append one.
  // Decode entries flagged finished are not routed to the experts (their rows are unspecified).
  virtual void forward_batch(void* x, const StepBatch& b);
  // Last stage: the token of every emitting entry (gen_step >= 0) from its last row, in entry
  // order, into tokens (alloc_tokens memory) and host (alloc_host memory, readable after
  // synchronize(); or null): greedy or sampled by params (one per emitting entry, host memory; null:
  // the defaults), keyed by (seed, seq, gen_step) with seq as given (SamplingParams::first_sequence
  // is not added); after an EOS a slot repeats the EOS it produced. A step with a sampled entry
  // waits for its logits on the host (GPU executors); a greedy one queues only.
  virtual void choose_batch(const void* x, const StepBatch& b, const SeqSampling* params, int32_t* tokens,
                            int32_t* host);

  // Device executors: queues a count of the NaN / +-Inf values among the first n fp32 elements of a
  // buffer in its memory (a hidden-state buffer) into *count, host memory from alloc_host() that
  // the caller zeroed; readable once the queued work is done (synchronize()). Returns false where
  // the backend has no such kernel (then nothing is queued, and model/checked_stage.h checks only
  // the head's host outputs). Host executors need not implement it: their buffers are read directly.
  virtual bool count_nonfinite(const void* buf, int64_t n, uint32_t* count) {
    (void)buf, (void)n, (void)count;
    return false;
  }
};

// The CPU reference executor: fp32 weights and activations, fp32 accumulation, n_threads workers
// (0: hardware concurrency). Reads only the datasets of its range from `weights`.
// fp8_activations (an FP8 file only, docs/fp8.md): besides its dequantized weights, quantize the
// input of every FP8 product to e4m3 on the fly (per token, or per 128-column group under the block128
// scheme); off, the stage is the weights-only oracle. A bf16/fp16/fp32 file ignores it.
// kv_fp8 (--kv-dtype fp8): generation's KV cache rows quantized to e4m3 with a scale per (position,
// KV head) as the GPU stores them, kept dequantized in fp32 pools (kernels/paged_kv.h).
std::unique_ptr<StageExecutor> make_cpu_stage(WeightReader& weights, const StageLayers& stage, int n_threads = 0,
                                              bool fp8_activations = false, bool kv_fp8 = false);

}  // namespace lfm2
