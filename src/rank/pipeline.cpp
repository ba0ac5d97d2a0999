#include "rank/pipeline.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>

#include "common/error.h"

namespace lfm2 {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// MPI guarantees tags up to 32767; messages between two ranks do not overtake, so a wrapped tag is
// still unambiguous.
int tag_of(int64_t m) { return int(m % 32767); }

std::string what(int64_t m) { return cat("microbatch ", m); }

}  // namespace

int64_t PipelineShape::micro_size(int64_t m) const { return std::min(microbatch, n_seq - m * microbatch); }

double gpipe_bubble(int n_stages, int64_t n_micro) { return double(n_stages - 1) / double(n_micro + n_stages - 1); }

Pipeline::Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, const PipelineShape& shape)
    : world_(world), exec_(exec), transport_(transport), shape_(shape) {
  LFM2_CHECK(shape_.n_seq > 0 && shape_.seq_len > 0 && shape_.microbatch > 0, "pipeline: empty batch");
  LFM2_CHECK(!exec_.on_device() || transport_.accepts_device_memory(), "the ", transport_.name(),
             " transport cannot move device buffers");
  const int64_t N = shape_.n_seq, S = shape_.seq_len, V = shape_.vocab;
  const int64_t max_tokens = std::min(shape_.microbatch, N) * S;
  n_buf_ = world_.size == 1 ? 1 : 3;
  for (int b = 0; b < n_buf_; ++b) buf_.push_back(exec_.alloc_hidden(max_tokens));
  if (world_.is_first()) ids_ = static_cast<int32_t*>(exec_.alloc_host(N * S * int64_t(sizeof(int32_t))));
  if (world_.is_last()) {
    next_token_ = static_cast<int32_t*>(exec_.alloc_host(N * int64_t(sizeof(int32_t))));
    margin_ = static_cast<float*>(exec_.alloc_host(N * int64_t(sizeof(float))));
    if (shape_.logits) logits_ = static_cast<float*>(exec_.alloc_host(N * V * int64_t(sizeof(float))));
    if (shape_.all_logits) all_logits_ = static_cast<float*>(exec_.alloc_host(N * S * V * int64_t(sizeof(float))));
    if (!shape_.lengths.empty()) {
      LFM2_CHECK(int64_t(shape_.lengths.size()) == N, "pipeline: ", shape_.lengths.size(), " lengths for ", N,
                 " sequences");
      lengths_ = static_cast<int32_t*>(exec_.alloc_host(N * int64_t(sizeof(int32_t))));
      std::copy(shape_.lengths.begin(), shape_.lengths.end(), lengths_);
    }
  }
}

size_t Pipeline::micro_bytes(int64_t m) const {
  return size_t(shape_.micro_size(m) * shape_.seq_len * shape_.hidden) * dtype_size(exec_.act_dtype());
}

void Pipeline::set_tracing(bool on) {
  tracing_ = on;
  transport_.set_tracing(on);
}

// One run of the schedule on this rank (see pipeline.h). `device` selects the queue-only path.
class Pipeline::Run {
 public:
  using Handle = Transport::Handle;

  Run(Pipeline& p, PipelineResult* result)
      : p_(p),
        sh_(p.shape_),
        result_(result),
        M_(sh_.n_micro()),
        B_(p.n_buf_),
        first_(p.world_.is_first()),
        last_(p.world_.is_last()),
        device_(p.exec_.on_device() && p.timer_ != nullptr),
        recv_h_(size_t(B_), Transport::kNone),
        send_h_(size_t(B_), Transport::kNone) {}

  StageTiming go() {
    origin_ = now_s();
    if (device_) p_.timer_->reset();
    for (int64_t m = 0; m < M_; ++m) {
      const double t_queue = now_s();
      {
        NvtxRange range("queue microbatch");
        acquire(m);
        post_recvs_ahead(m);
        compute(m);
        if (!last_) send(m);
        release_done();
      }
      if (device_) host_span("queue", m, t_queue);
      if (m == p_.kill_after_) std::raise(p_.kill_signal_);
    }
    finish();
    StageTiming t;
    t.wall_s = now_s() - (t_first_ < 0 ? origin_ : t_first_);
    t.busy_s = device_ ? p_.timer_->busy_s() : busy_s_;
    if (p_.tracing_) collect_trace();
    if (last_) copy_results();
    return t;
  }

 private:
  struct Pending {
    Handle h;
    int64_t m;
    bool is_send;
    bool ordered;  // device receive: the compute stream already waits for it
    double posted_s;
  };

  int buffer_of(int64_t m) const { return int(m % B_); }

  // Buffer m % B holds m's input: on the first stage it is free to embed into (the send out of it,
  // of microbatch m - B, is done), elsewhere microbatch m has been received into it.
  void acquire(int64_t m) {
    const int b = buffer_of(m);
    if (first_) {
      if (send_h_[size_t(b)] == Transport::kNone) return;
      if (device_)
        p_.transport_.order_compute_after(send_h_[size_t(b)]);
      else
        wait_pending(send_h_[size_t(b)], "wait send", m - B_);
      send_h_[size_t(b)] = Transport::kNone;
      return;
    }
    while (next_recv_ <= m) post_recv(next_recv_++);
    const Handle h = recv_h_[size_t(b)];
    recv_h_[size_t(b)] = Transport::kNone;
    if (device_) {
      p_.transport_.order_compute_after(h);
      for (Pending& q : pending_)
        if (q.h == h && !q.is_send) q.ordered = true;
    } else {
      wait_pending(h, "wait recv", m);
    }
    if (t_first_ < 0) t_first_ = now_s();
  }

  // Starts receiving microbatch j into buffer j % B, whose last reader (microbatch j - B) has been
  // queued. A device transport orders the receive after the send out of that buffer; on the host
  // that send is waited for here.
  void post_recv(int64_t j) {
    const int b = buffer_of(j);
    Handle after = send_h_[size_t(b)];
    send_h_[size_t(b)] = Transport::kNone;
    if (after != Transport::kNone && !device_) {
      wait_pending(after, "wait send", j - B_);
      after = Transport::kNone;
    }
    const Handle h = p_.transport_.irecv(p_.buf_[size_t(b)], p_.micro_bytes(j), p_.world_.prev(), tag_of(j), after);
    recv_h_[size_t(b)] = h;
    pending_.push_back({h, j, false, false, now_s()});
  }

  // The receives of m+1 .. m+B-1 that can start now, so that they overlap m's compute. On the host
  // only those whose buffer's last send has completed (tested, not waited for).
  void post_recvs_ahead(int64_t m) {
    if (first_) return;
    while (next_recv_ < std::min(M_, m + B_)) {
      const Handle s = send_h_[size_t(buffer_of(next_recv_))];
      if (!device_ && s != Transport::kNone && !test_pending(s)) return;
      post_recv(next_recv_++);
    }
  }

  void compute(int64_t m) {
    const int64_t seq0 = sh_.micro_begin(m), n = sh_.micro_size(m), S = sh_.seq_len, V = sh_.vocab;
    void* x = p_.buf_[size_t(buffer_of(m))];
    if (first_) step("embed", m, [&] { p_.exec_.embed(p_.ids_ + seq0 * S, n, S, x); });
    step("forward", m, [&] { p_.exec_.forward(x, n, S); });
    if (last_) {
      HeadOutputs out;
      out.next_token = p_.next_token_ + seq0;
      out.margin = p_.margin_ + seq0;
      out.logits = p_.logits_ ? p_.logits_ + seq0 * V : nullptr;
      out.all_logits = p_.all_logits_ ? p_.all_logits_ + seq0 * S * V : nullptr;
      const int32_t* lengths = p_.lengths_ ? p_.lengths_ + seq0 : nullptr;
      step("head", m, [&] { p_.exec_.head(x, n, S, lengths, out); });
    }
  }

  void send(int64_t m) {
    const int b = buffer_of(m);
    const Handle h = p_.transport_.isend(p_.buf_[size_t(b)], p_.micro_bytes(m), p_.world_.next(), tag_of(m));
    send_h_[size_t(b)] = h;
    pending_.push_back({h, m, true, false, now_s()});
  }

  // One step of compute. Device: only queued, bracketed by the timer's events. Host: run to
  // completion on a worker thread while this (the MPI) thread keeps the transfers moving; with a
  // single stage there is nothing to move and it runs inline.
  template <typename Fn>
  void step(const char* name, int64_t m, Fn&& fn) {
    if (t_first_ < 0) t_first_ = now_s();
    if (device_) {
      p_.timer_->begin(name, m);
      fn();
      p_.timer_->end();
      return;
    }
    const double t0 = now_s();
    if (p_.world_.size == 1) {
      fn();
      p_.exec_.synchronize();
    } else {
      auto done = std::async(std::launch::async, [&] {
        fn();
        p_.exec_.synchronize();
      });
      while (done.wait_for(std::chrono::microseconds(200)) != std::future_status::ready) p_.transport_.progress();
      done.get();  // rethrows a compute error here
    }
    const double t1 = now_s();
    busy_s_ += t1 - t0;
    span(Track::kCompute, name, m, t0, t1);
  }

  // Releases the transfers at the front of the queue that have completed (a test, never a wait).
  // A device receive is released only once the compute stream has been ordered after it.
  void release_done() {
    while (!pending_.empty()) {
      const Pending& q = pending_.front();
      if (!q.is_send && !q.ordered) return;
      if (!p_.transport_.test(q.h)) return;
      released(q);
      pending_.erase(pending_.begin());
    }
  }

  // Waits for every transfer still pending, in the order they were posted, then for the compute.
  void finish() {
    while (!pending_.empty()) {
      const Pending q = pending_.front();
      const double t0 = now_s();
      p_.transport_.wait(q.h, what(q.m));
      host_span(q.is_send ? "wait send" : "wait recv", q.m, t0);
      released(q);
      pending_.erase(pending_.begin());
    }
    if (device_) {
      const double t0 = now_s();
      p_.exec_.synchronize();  // every transfer it depended on has completed, so this cannot hang
      host_span("wait compute", -1, t0);
    }
  }

  // Host path: waits for one pending operation (a send whose buffer is needed, or a receive whose
  // data is), releasing it.
  void wait_pending(Handle h, const char* name, int64_t m) {
    const auto it = find(h);
    const double t0 = now_s();
    p_.transport_.wait(h, what(it->m));
    host_span(name, m, t0);
    released(*it);
    pending_.erase(it);
  }

  // Host path: tests one pending operation, releasing it when complete.
  bool test_pending(Handle h) {
    const auto it = find(h);
    if (!p_.transport_.test(h)) return false;
    released(*it);
    pending_.erase(it);
    return true;
  }

  std::vector<Pending>::iterator find(Handle h) {
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& q) { return q.h == h; });
    LFM2_CHECK(it != pending_.end(), "pipeline: transfer handle ", h, " is not pending");
    return it;
  }

  // A released handle may be reused by the transport: forget it everywhere. The host path records
  // the transfer's span as the host saw it (posted to found complete).
  void released(const Pending& q) {
    for (Handle& h : q.is_send ? send_h_ : recv_h_)
      if (h == q.h) h = Transport::kNone;
    if (!device_) span(q.is_send ? Track::kSend : Track::kRecv, q.is_send ? "send" : "recv", q.m, q.posted_s, now_s());
  }

  void span(Track track, const char* name, int64_t m, double t0, double t1) {
    if (p_.tracing_) trace_.push_back({track, name, m, t0 - origin_, t1 - origin_});
  }
  void host_span(const char* name, int64_t m, double t0) { span(Track::kHost, name, m, t0, now_s()); }

  void collect_trace() {
    if (device_) {
      for (TraceSpan& s : p_.timer_->spans()) trace_.push_back(std::move(s));
      for (TraceSpan& s : p_.transport_.transfer_spans()) trace_.push_back(std::move(s));
    }
    std::stable_sort(trace_.begin(), trace_.end(), [](const TraceSpan& a, const TraceSpan& b) {
      return a.track != b.track ? a.track < b.track : a.begin_s < b.begin_s;
    });
    p_.trace_ = std::move(trace_);
  }

  void copy_results() {
    LFM2_CHECK(result_, "pipeline: the last stage needs a result");
    const int64_t N = sh_.n_seq, S = sh_.seq_len, V = sh_.vocab;
    result_->next_token.assign(p_.next_token_, p_.next_token_ + N);
    result_->margin.assign(p_.margin_, p_.margin_ + N);
    result_->logits.assign(p_.logits_, p_.logits_ ? p_.logits_ + N * V : p_.logits_);
    result_->all_logits.assign(p_.all_logits_, p_.all_logits_ ? p_.all_logits_ + N * S * V : p_.all_logits_);
  }

  Pipeline& p_;
  const PipelineShape& sh_;
  PipelineResult* result_;
  const int64_t M_;
  const int B_;
  const bool first_, last_, device_;
  std::vector<Handle> recv_h_, send_h_;  // per buffer: its pending receive / the last send out of it
  std::vector<Pending> pending_;         // transfers not yet released, in the order posted
  int64_t next_recv_ = 0;                // the next microbatch to post a receive for
  double origin_ = 0, t_first_ = -1, busy_s_ = 0;
  std::vector<TraceSpan> trace_;
};

StageTiming Pipeline::run(const int32_t* ids, PipelineResult* result) {
  LFM2_CHECK(!world_.is_first() || ids, "pipeline: the first stage needs the input ids");
  LFM2_CHECK(!world_.is_last() || result, "pipeline: the last stage needs a result");
  if (world_.is_first()) std::memcpy(ids_, ids, size_t(shape_.n_seq * shape_.seq_len) * sizeof(int32_t));
  return Run(*this, result).go();
}

}  // namespace lfm2
