// CUDA Graphs of the CUDA stage's layer loop: one per (hidden buffer, rows, kind), captured the
// first time it is asked for and replayed after: one launch instead of ~15 per layer. Capture
// needs nothing but the stream (the loop queues kernels only: no allocation, no synchronisation, no
// host read of a device value). A decode step's graph serves every step of its rows: its kernels
// read the step's descriptors from fixed device addresses (cuda_decode_state.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include <cuda_runtime_api.h>

namespace lfm2 {

class CudaGraphs {
 public:
  enum class Kind { kForward, kDecode };  // forward(): scoring; a generation decode step
  struct Key {
    const void* x;  // the hidden-state buffer
    int64_t n_seq, seq_len;
    Kind kind;
    bool operator<(const Key& o) const {
      return std::tie(x, n_seq, seq_len, kind) < std::tie(o.x, o.n_seq, o.seq_len, o.kind);
    }
  };

  // on: replay graphs; off: run() queues the work itself every time (--cuda-graphs off, or
  // LFM2_SYNC_CHECK, which synchronises after each launch and so cannot be captured).
  explicit CudaGraphs(bool on) : on_(on) {}
  CudaGraphs(const CudaGraphs&) = delete;
  CudaGraphs& operator=(const CudaGraphs&) = delete;
  ~CudaGraphs() { release(); }

  bool on() const { return on_; }

  // Queues `queue` (work on `stream` only): replayed from the graph of `key`, captured into it the
  // first time; or queued directly when graphs are off.
  template <typename Queue>
  void run(const Key& key, cudaStream_t stream, Queue&& queue) {
    if (!on_) return queue();
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, capture(stream, queue)).first;
    launch(it->second, stream);
  }

  // Forgets the graphs of one kind (their buffers are about to change).
  void forget(Kind kind);
  void release();

 private:
  static cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& queue);
  static void launch(cudaGraphExec_t graph, cudaStream_t stream);

  bool on_;
  std::map<Key, cudaGraphExec_t> graphs_;
};

}  // namespace lfm2
