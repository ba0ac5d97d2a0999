#include "rank/engine/pipeline.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>
#include <iterator>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "rank/engine/nvtx_range.h"

namespace lfm2 {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// MPI guarantees tags up to 32767; messages between two ranks do not overtake, so a wrapped tag is
// still unambiguous.
int tag_of(int64_t m) { return int(m % 32767); }

}  // namespace

double gpipe_bubble(int n_stages, int64_t n_micro) { return double(n_stages - 1) / double(n_micro + n_stages - 1); }

Pipeline::Pipeline(const WorldConfig& world, StageExecutor& exec, Transport& transport, int64_t hidden,
                   int64_t max_item_tokens)
    : world_(world), exec_(exec), transport_(transport) {
  LFM2_CHECK(max_item_tokens > 0, "pipeline: empty items");
  LFM2_CHECK(!exec_.on_device() || transport_.accepts_device_memory(), "the ", transport_.name(),
             " transport cannot move device buffers");
  n_buf_ = world_.size == 1 ? 1 : 3;
  buffer_bytes_ = size_t(max_item_tokens * hidden) * dtype_size(exec_.act_dtype());
  for (int b = 0; b < n_buf_; ++b) buf_.push_back(exec_.alloc_hidden(max_item_tokens));
  if (exec_.on_device()) queue_guard_ = std::make_unique<Watchdog>(log_prefix(), world_.rank);
}

void Pipeline::set_tracing(bool on) {
  tracing_ = on;
  transport_.set_tracing(on);
}

// One run of a job on this rank (see pipeline.h). `device` selects the queue-only path.
class Pipeline::Run {
 public:
  using Handle = Transport::Handle;

  Run(Pipeline& p, PipelineJob& job)
      : p_(p),
        job_(job),
        M_(job.n_items()),
        B_(p.n_buf_),
        first_(p.world_.is_first()),
        last_(p.world_.is_last()),
        device_(p.exec_.on_device() && p.timer_ != nullptr),
        recv_h_(size_t(B_), Transport::kNone),
        send_h_(size_t(B_), Transport::kNone) {}

  StageTiming go() {
    origin_ = now_s();
    if (device_) p_.timer_->reset();
    for (int64_t i = 0; i < M_; ++i) {
      const double t_queue = now_s();
      {
        NvtxRange range("queue item");
        const QueueGuard guard(p_.queue_guard_.get(), job_, i, p_.transport_.timeout_s());
        acquire(i);
        post_recvs_ahead(i);
        compute(i);
        if (!last_) send(i);
        release_done();
      }
      if (device_) host_span("queue", i, t_queue);
      if (i == p_.kill_after_) std::raise(p_.kill_signal_);
    }
    finish();
    StageTiming t;
    t.wall_s = now_s() - (t_first_ < 0 ? origin_ : t_first_);
    t.busy_s = device_ ? p_.timer_->busy_s() : busy_s_;
    if (p_.tracing_) collect_trace();
    return t;
  }

 private:
  // Arms the watchdog (if any) while one item is queued; disarms it however the scope ends.
  struct QueueGuard {
    Watchdog* w;
    QueueGuard(Watchdog* watchdog, const PipelineJob& job, int64_t i, double timeout_s) : w(watchdog) {
      if (w)
        w->arm(cat("queueing ", job.item_name(i), " on the GPU"), timeout_s,
               "the host was held inside a CUDA call (one that waits for the whole device, behind a transfer "
               "that cannot finish?)");
    }
    ~QueueGuard() {
      if (w) w->disarm();
    }
  };

  enum class Kind { kRecv, kSend, kFeedbackRecv, kFeedbackSend };
  struct Pending {
    Handle h;
    int64_t i;
    Kind kind;
    bool ordered;  // device receive: the compute stream already waits for it
    double posted_s;
    bool is_send() const { return kind == Kind::kSend || kind == Kind::kFeedbackSend; }
  };

  int buffer_of(int64_t i) const { return int(i % B_); }
  size_t bytes_of(int64_t i) const {
    const size_t b = job_.item_bytes(i);
    LFM2_CHECK(b <= p_.buffer_bytes_, "pipeline: item ", i, " of ", b, " bytes, buffers of ", p_.buffer_bytes_);
    return b;
  }

  // Buffer i % B holds i's input: on the first stage it is free to embed into (the send out of it,
  // of item i - B, is done) and the feedback i needs has arrived; elsewhere item i has been received.
  void acquire(int64_t i) {
    const int b = buffer_of(i);
    if (first_) {
      if (send_h_[size_t(b)] != Transport::kNone) after_done(send_h_[size_t(b)], "wait send", i - B_);
      send_h_[size_t(b)] = Transport::kNone;
      receive_feedback(i);
      return;
    }
    while (next_recv_ <= i) post_recv(next_recv_++);
    const Handle h = recv_h_[size_t(b)];
    recv_h_[size_t(b)] = Transport::kNone;
    after_done(h, "wait recv", i);
    if (t_first_ < 0) t_first_ = now_s();
  }

  // The compute queued next follows operation h: ordered on the device (h stays pending, marked
  // ordered), or waited for on the host (h released).
  void after_done(Handle h, const char* what, int64_t i) {
    if (!device_) return wait_pending(h, what, i);
    p_.transport_.order_compute_after(h);
    for (Pending& q : pending_)
      if (q.h == h) q.ordered = true;
  }

  // Starts receiving item j into buffer j % B, whose last reader (item j - B) has been queued. A
  // device transport orders the receive after the send out of that buffer; on the host that send
  // is waited for here.
  void post_recv(int64_t j) {
    const int b = buffer_of(j);
    Handle after = send_h_[size_t(b)];
    send_h_[size_t(b)] = Transport::kNone;
    if (after != Transport::kNone && !device_) {
      wait_pending(after, "wait send", j - B_);
      after = Transport::kNone;
    }
    const Handle h = p_.transport_.irecv(p_.buf_[size_t(b)], bytes_of(j), p_.world_.prev(), tag_of(j), after);
    recv_h_[size_t(b)] = h;
    pending_.push_back({h, j, Kind::kRecv, false, now_s()});
  }

  // The receives of i+1 .. i+B-1 that can start now, so that they overlap i's compute. On the host
  // only those whose buffer's last send has completed (tested, not waited for). Never one whose
  // item needs feedback from an item this rank has yet to queue (generation with fewer microbatches
  // than buffers): its NCCL kernel would spin for data that only this host's next steps can
  // release, and any CUDA call that waits for the whole device (loading a kernel's module on first
  // use does) would then wait forever.
  void post_recvs_ahead(int64_t i) {
    if (first_) return;
    while (next_recv_ < std::min(M_, i + B_)) {
      if (job_.feedback_source(next_recv_) >= i) return;
      const Handle s = send_h_[size_t(buffer_of(next_recv_))];
      if (!device_ && s != Transport::kNone && !test_pending(s)) return;
      post_recv(next_recv_++);
    }
  }

  // First stage, P > 1: the feedback item i needs (the last stage's output of an earlier item),
  // received into its slot, whose last reader (an earlier input) has been queued.
  void receive_feedback(int64_t i) {
    const int64_t src = job_.feedback_source(i);
    if (src < 0 || last_) return;  // none, or one stage: the input reads what the output wrote
    const int slot = job_.feedback_slot(src);
    const Handle h = p_.transport_.irecv(job_.feedback_buffer(slot), job_.feedback_bytes(src), p_.world_.size - 1,
                                         tag_of(src), Transport::kNone);
    pending_.push_back({h, src, Kind::kFeedbackRecv, false, now_s()});
    after_done(h, "wait feedback", src);
  }

  void compute(int64_t i) {
    void* x = p_.buf_[size_t(buffer_of(i))];
    if (first_) step(job_.input_name(), i, [&] { job_.input(i, x); });
    step(job_.layers_name(), i, [&] { job_.layers(i, x); });
    if (!last_) return;
    const bool feeds = job_.feeds_back(i) && !first_;
    const int slot = feeds ? job_.feedback_slot(i) : 0;
    if (feeds && fb_send_h_.count(slot)) {  // the slot's last send must be done before it is rewritten
      after_done(fb_send_h_[slot], "wait feedback send", i);
      fb_send_h_.erase(slot);
    }
    step(job_.output_name(), i, [&] { job_.output(i, x); });
    if (!feeds) return;
    const Handle h = p_.transport_.isend(job_.feedback_buffer(slot), job_.feedback_bytes(i), 0, tag_of(i));
    fb_send_h_[slot] = h;
    pending_.push_back({h, i, Kind::kFeedbackSend, false, now_s()});
  }

  void send(int64_t i) {
    const int b = buffer_of(i);
    const Handle h = p_.transport_.isend(p_.buf_[size_t(b)], bytes_of(i), p_.world_.next(), tag_of(i));
    send_h_[size_t(b)] = h;
    pending_.push_back({h, i, Kind::kSend, false, now_s()});
  }

  // One step of compute. Device: only queued, bracketed by the timer's events. Host: run to
  // completion on a worker thread while this (the MPI) thread keeps the transfers moving; with a
  // single stage there is nothing to move and it runs inline.
  template <typename Fn>
  void step(const char* name, int64_t i, Fn&& fn) {
    if (t_first_ < 0) t_first_ = now_s();
    if (device_) {
      p_.timer_->begin(name, i);
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
    span(Track::kCompute, name, i, t0, t1);
  }

  // Releases the transfers at the front of the queue that have completed (a test, never a wait).
  // A device receive is released only once the compute stream has been ordered after it.
  void release_done() {
    while (!pending_.empty()) {
      const Pending& q = pending_.front();
      if (!q.is_send() && !q.ordered) return;
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
      p_.transport_.wait(q.h, job_.item_name(q.i));
      host_span(q.is_send() ? "wait send" : "wait recv", q.i, t0);
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
  void wait_pending(Handle h, const char* name, int64_t i) {
    const auto it = find(h);
    const double t0 = now_s();
    p_.transport_.wait(h, job_.item_name(it->i));
    host_span(name, i, t0);
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
    for (std::vector<Handle>* v : {&send_h_, &recv_h_})
      for (Handle& h : *v)
        if (h == q.h) h = Transport::kNone;
    for (auto it = fb_send_h_.begin(); it != fb_send_h_.end();)
      it = it->second == q.h ? fb_send_h_.erase(it) : std::next(it);
    if (device_) return;
    const bool feedback = q.kind == Kind::kFeedbackRecv || q.kind == Kind::kFeedbackSend;
    span(q.is_send() ? Track::kSend : Track::kRecv, feedback ? (q.is_send() ? "feedback send" : "feedback recv")
                                                             : (q.is_send() ? "send" : "recv"),
         q.i, q.posted_s, now_s());
  }

  void span(Track track, const char* name, int64_t i, double t0, double t1) {
    if (p_.tracing_) trace_.push_back({track, name, i, t0 - origin_, t1 - origin_});
  }
  void host_span(const char* name, int64_t i, double t0) { span(Track::kHost, name, i, t0, now_s()); }

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

  Pipeline& p_;
  PipelineJob& job_;
  const int64_t M_;
  const int B_;
  const bool first_, last_, device_;
  std::vector<Handle> recv_h_, send_h_;  // per buffer: its pending receive / the last send out of it
  std::map<int, Handle> fb_send_h_;      // per feedback slot: the last send out of it (last stage)
  std::vector<Pending> pending_;         // transfers not yet released, in the order posted
  int64_t next_recv_ = 0;                // the next item to post a receive for
  double origin_ = 0, t_first_ = -1, busy_s_ = 0;
  std::vector<TraceSpan> trace_;
};

StageTiming Pipeline::run(PipelineJob& job) { return Run(*this, job).go(); }

}  // namespace lfm2
