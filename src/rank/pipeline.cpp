#include "rank/pipeline.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>

#include "common/error.h"
#include "rank/validate.h"

namespace lfm2 {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// MPI guarantees tags up to 32767; messages between two ranks do not overtake, so a wrapped tag is
// still unambiguous.
int tag_of(int64_t m) { return int(m % 32767); }

}  // namespace

int64_t PipelineShape::micro_size(int64_t m) const { return std::min(microbatch, n_seq - m * microbatch); }

double gpipe_bubble(int n_stages, int64_t n_micro) { return double(n_stages - 1) / double(n_micro + n_stages - 1); }

Pipeline::Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, const PipelineShape& shape)
    : world_(world), exec_(exec), transport_(transport), shape_(shape) {
  LFM2_CHECK(shape_.n_seq > 0 && shape_.seq_len > 0 && shape_.microbatch > 0, "pipeline: empty batch");
  LFM2_CHECK(!exec_.on_device() || transport_.accepts_device_memory(), "the ", transport_.name(),
             " transport cannot move device buffers");
  const int64_t max_tokens = std::min(shape_.microbatch, shape_.n_seq) * shape_.seq_len;
  const int n_buf = world_.size == 1 ? 1 : 2;
  for (int b = 0; b < n_buf; ++b) buf_[b] = exec_.alloc_hidden(max_tokens);
  if (world_.is_last()) {
    int64_t rows = std::min(shape_.microbatch, shape_.n_seq) * (shape_.all_logits ? shape_.seq_len : 1);
    head_out_.resize(size_t(rows * shape_.vocab));
  }
}

size_t Pipeline::micro_bytes(int64_t m) const {
  return size_t(shape_.micro_size(m) * shape_.seq_len * shape_.hidden) * dtype_size(exec_.act_dtype());
}

StageTiming Pipeline::run(const int32_t* ids, PipelineResult* result) {
  const PipelineShape& sh = shape_;
  const int64_t M = sh.n_micro(), S = sh.seq_len, V = sh.vocab;
  const bool first = world_.is_first(), last = world_.is_last();
  LFM2_CHECK(!first || ids, "pipeline: the first stage needs the input ids");
  if (last) {
    LFM2_CHECK(result, "pipeline: the last stage needs a result");
    result->next_token.assign(size_t(sh.n_seq), 0);
    result->logits.assign(size_t(sh.n_seq * V), 0.0f);
    result->all_logits.assign(sh.all_logits ? size_t(sh.n_seq * S * V) : 0, 0.0f);
  }
  Transport::Handle send_h[2] = {Transport::kNone, Transport::kNone};
  Transport::Handle recv_h[2] = {Transport::kNone, Transport::kNone};
  auto what = [](int64_t m) { return cat("microbatch ", m); };
  // Device path: compute is queued, not run, and transfers are ordered on the device (pipeline.h).
  const bool async = exec_.on_device() && timer_ != nullptr;
  if (async) timer_->reset();
  struct Pending {
    Transport::Handle h;
    int64_t m;
  };
  std::vector<Pending> later;  // device sends whose buffer is reused in stream order
  // Buffer b is free again once the send out of it has completed. A receive into it on a device
  // transport is ordered after that send on the transport's stream, so the host need not wait.
  auto free_buffer = [&](int b, int64_t m_sent, bool for_recv) {
    if (send_h[b] == Transport::kNone) return;
    if (async && for_recv)
      later.push_back({send_h[b], m_sent});
    else
      transport_.wait(send_h[b], what(m_sent));
    send_h[b] = Transport::kNone;
  };
  auto post_recv = [&](int64_t m) {
    const int b = int(m % 2);
    free_buffer(b, m - 2, true);
    recv_h[b] = transport_.irecv(buf_[b], micro_bytes(m), world_.prev(), tag_of(m));
  };

  StageTiming t;
  double t_start = -1;
  // Compute runs on a worker thread while this (the MPI) thread keeps the transfers moving; with a
  // single stage there is nothing to move and it runs inline. On the device it is only queued.
  auto busy = [&](auto&& fn) {
    double t0 = now_s();
    if (t_start < 0) t_start = t0;
    if (async) {
      timer_->begin();
      fn();
      timer_->end();
      return;
    }
    if (world_.size == 1) {
      fn();
      exec_.synchronize();
    } else {
      auto done = std::async(std::launch::async, [&] {
        fn();
        exec_.synchronize();
      });
      while (done.wait_for(std::chrono::microseconds(200)) != std::future_status::ready) transport_.progress();
      done.get();  // rethrows a compute error here
    }
    t.busy_s += now_s() - t0;
  };

  if (!first) post_recv(0);
  for (int64_t m = 0; m < M; ++m) {
    const int b = world_.size == 1 ? 0 : int(m % 2);
    const int64_t seq0 = sh.micro_begin(m), n = sh.micro_size(m);
    if (first) {
      free_buffer(b, m - 2, false);
      busy([&] { exec_.embed(ids + seq0 * S, n, S, buf_[b]); });
    } else {
      transport_.wait(recv_h[b], what(m));
      recv_h[b] = Transport::kNone;
      if (t_start < 0) t_start = now_s();
      if (m + 1 < M) post_recv(m + 1);
    }
    busy([&] { exec_.forward(buf_[b], n, S); });
    if (last) {
      busy([&] { exec_.head(buf_[b], n, S, sh.all_logits, head_out_.data()); });
      for (int64_t i = 0; i < n; ++i) {
        const float* row = head_out_.data() + (sh.all_logits ? (i * S + S - 1) : i) * V;
        std::memcpy(result->logits.data() + (seq0 + i) * V, row, size_t(V) * sizeof(float));
        result->next_token[seq0 + i] = argmax(row, V);
      }
      if (sh.all_logits)
        std::memcpy(result->all_logits.data() + seq0 * S * V, head_out_.data(), size_t(n * S * V) * sizeof(float));
    } else {
      send_h[b] = transport_.isend(buf_[b], micro_bytes(m), world_.next(), tag_of(m));
    }
    // Release the device sends that have completed meanwhile (a check, never a wait).
    while (!later.empty() && transport_.test(later.front().h)) later.erase(later.begin());
    if (m == kill_after_) std::raise(kill_signal_);
  }
  for (int b = 0; b < 2; ++b) free_buffer(b, M - 2 + ((M % 2) == b ? 0 : 1), false);
  for (const Pending& p : later) transport_.wait(p.h, what(p.m));
  if (async) {
    exec_.synchronize();  // every transfer it depended on has completed, so this cannot hang
    t.busy_s = timer_->busy_s();
  }
  t.wall_s = t_start < 0 ? 0 : now_s() - t_start;
  return t;
}

}  // namespace lfm2
