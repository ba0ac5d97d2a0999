// The NCCL transport (see nccl_transport.h): ncclSend / ncclRecv of device hidden-state buffers, one
// communicator per link parity and one stream per direction, ordered against the executor's
// compute stream by CUDA events.
//
// isend(buf):          compute --record(ready)--> send stream waits(ready), ncclSend, record(done).
//                      The send starts once the compute that wrote buf is done.
// irecv(buf, after):   compute --record(ready)--> recv stream waits(ready) and waits(after.done),
//                      ncclRecv, record(done): the receive starts once the compute that last read
//                      buf and the send out of buf are done.
// order_compute_after: the compute stream waits(done): what is queued next reads the received data
//                      (or overwrites the sent buffer) only after the transfer.
// test/wait:           poll cudaEventQuery(done) and ncclCommGetAsyncError. A receive completed
//                      before anyone ordered the compute after it is ordered then.
// Sends use the communicator of link rank -> rank+1, receives that of link rank-1 -> rank: on
// different communicators (link parities), each with its own stream, a stage's send of m and its
// receive of m+1 run side by side. The feedback link (last rank -> rank 0: generation's tokens) has
// a third communicator and a stream of its own (the communicators: nccl_comms.h). On an NCCL error
// or a timeout the communicators are aborted (ncclCommAbort: nothing of them can hang any more) and
// lfm2::Error is thrown; lfm2-rank then ends the job with MPI_Abort.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/log.h"
#include "rank/mpi/world.h"
#include "rank/transport/nccl_comms.h"
#include "rank/transport/nccl_transport.h"

namespace lfm2 {
namespace {

constexpr size_t kWarmupBytes = size_t(1) << 20;  // per direction
// Creating a communicator takes seconds (topology discovery, connections): its deadline is --timeout
// but never under this, so that a short --timeout meant for stalled peers does not fail a healthy init.
constexpr double kMinInitTimeoutS = 60;
// SMs an NCCL kernel may take (kNcclMaxCtas, nccl_transport.h). A transfer is posted ahead of its data
// and its kernel waits on its SMs for the peer, beside the stage's layers, whose persistent GEMMs
// leave those SMs free (reserve_sms); two CTAs still move a 33 MB microbatch in about a millisecond.

class NcclTransportImpl final : public NcclTransport {
 public:
  NcclTransportImpl(const WorldConfig& world, CudaStageExecutor& exec, double timeout_s)
      : world_(world), exec_(exec), device_(exec.device()), comms_(world, exec.device()) {
    timeout_s_ = timeout_s;
    CUDA_CHECK(cudaSetDevice(device_));
    for (cudaStream_t* s : {&send_stream_, &recv_stream_, &fb_stream_})
      CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    // Allocated before the communicators, like every other buffer of the run.
    CUDA_CHECK(cudaMalloc(&warm_, 2 * kWarmupBytes));
    CUDA_CHECK(cudaMemsetAsync(warm_, 0, 2 * kWarmupBytes, send_stream_));
  }

  ~NcclTransportImpl() override {
    cudaSetDevice(device_);
    comms_.finalize();
    for (cudaStream_t s : {send_stream_, recv_stream_, fb_stream_})
      if (s) cudaStreamSynchronize(s);
    for (auto& s : slots_)
      for (cudaEvent_t e : {s.ready, s.done, s.t_begin, s.t_end})
        if (e) cudaEventDestroy(e);
    if (warm_) cudaFree(warm_);
    for (cudaStream_t s : {send_stream_, recv_stream_, fb_stream_})
      if (s) cudaStreamDestroy(s);
  }

  const char* name() const override { return "nccl"; }
  bool accepts_device_memory() const override { return true; }
  void set_timeline(std::function<CUevent_st*()> origin) override { timeline_ = std::move(origin); }
  void set_tracing(bool on) override { tracing_ = on; }

  void connect() override {
    LFM2_CHECK(!connected_, "nccl: connect() called twice");
    connected_ = true;
    // NVLink SHARP (NVLS) multicast buys nothing for point-to-point and its set-up fails on some
    // machines; the user's environment wins when it says otherwise.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    CUDA_CHECK(cudaSetDevice(device_));
    if (world_.size == 1) return;  // P = 1 moves nothing
    const double init_s = std::max(timeout_s_, kMinInitTimeoutS);
    comms_.create(kNcclMaxCtas, timeout_s_, init_s);

    warm_up(init_s);
  }

  // Sends go to the next rank, or from the last rank to rank 0 (feedback); each link has its own
  // communicator and stream.
  Handle isend(const void* buf, size_t bytes, int peer, int tag) override {
    const bool feedback = peer != world_.next();
    LFM2_CHECK(!feedback || (world_.is_last() && peer == 0), "nccl transport: rank ", world_.rank,
               " sends to the next rank (or, the last, to rank 0), not to ", peer);
    ncclComm_t comm = feedback ? comms_.feedback() : comms_.send();
    return post(true, const_cast<void*>(buf), bytes, peer, tag, kNone, comm, feedback ? fb_stream_ : send_stream_);
  }

  // Receives come from the previous rank, or on rank 0 from the last rank (feedback).
  Handle irecv(void* buf, size_t bytes, int peer, int tag, Handle after) override {
    const bool feedback = peer != world_.prev();
    LFM2_CHECK(!feedback || (world_.is_first() && peer == world_.size - 1), "nccl transport: rank ", world_.rank,
               " receives from the previous rank (or, rank 0, from the last), not from ", peer);
    if (after != kNone) LFM2_CHECK(slot(after).is_send, "nccl transport: a receive follows a send, not a receive");
    ncclComm_t comm = feedback ? comms_.feedback() : comms_.recv();
    return post(false, buf, bytes, peer, tag, after, comm, feedback ? fb_stream_ : recv_stream_);
  }

  void order_compute_after(Handle h) override {
    Slot& s = slot(h);
    exec_.wait_event(s.done);
    s.ordered = true;
  }

  bool test(Handle h) override {
    Slot& s = slot(h);
    comms_.check_async(cat(s.is_send ? "sending to " : "receiving from ", world_.rank_name(s.peer)));
    const cudaError_t e = cudaEventQuery(s.done);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      comms_.fail(cat(s.is_send ? "sending to " : "receiving from ", world_.rank_name(s.peer), ": CUDA error ",
               cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    }
    if (!s.is_send && !s.ordered) exec_.wait_event(s.done);  // the compute that reads the data follows it
    if (tracing_ && timeline_) record_span(s);
    s.used = false;
    return true;
  }

  void wait(Handle h, const std::string& what) override {
    const Slot& s = slot(h);
    const int peer = s.peer;
    const bool is_send = s.is_send;
    if (poll_until([&] { return test(h); }, timeout_s_)) return;
    // A timeout, as over MPI: its kind sets the reporting rank's stagger (mpi/fatal.h), so that the
    // stalled rank's neighbours speak first.
    comms_.abort();
    if (is_send)
      LFM2_SEND_TIMEOUT("timed out after ", timeout_s_, " s waiting to send ", what, " to ", world_.rank_name(peer),
                        " (did it stop? see --timeout)");
    LFM2_TIMEOUT("timed out after ", timeout_s_, " s waiting to receive ", what, " from ", world_.rank_name(peer),
                 " (did it stop? see --timeout)");
  }

  std::vector<TraceSpan> transfer_spans() override { return std::move(spans_); }

 private:
  struct Slot {
    cudaEvent_t ready = nullptr, done = nullptr;      // compute done (before the op), op done
    cudaEvent_t t_begin = nullptr, t_end = nullptr;   // timing (--trace only)
    int peer = -1, tag = 0;
    bool is_send = false, used = false, ordered = false;
  };

  Handle take_slot(int peer, int tag, bool is_send) {
    LFM2_CHECK(comms_.created(), "nccl: the transport is not connected");
    size_t i = 0;
    while (i < slots_.size() && slots_[i].used) ++i;
    if (i == slots_.size()) {
      CUDA_CHECK(cudaSetDevice(device_));
      Slot s;
      CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      slots_.push_back(s);
    }
    Slot& s = slots_[i];
    s.peer = peer;
    s.tag = tag;
    s.is_send = is_send;
    s.used = true;
    s.ordered = false;
    return Handle(i);
  }

  Slot& slot(Handle h) {
    LFM2_CHECK(h >= 0 && size_t(h) < slots_.size() && slots_[size_t(h)].used, "transport: stale handle ", h);
    return slots_[size_t(h)];
  }

  // Queues one ncclSend or ncclRecv on `stream` after the compute queued so far (and after the
  // send `after`, kNone for none), between timing marks, its slot's done event recorded after it.
  Handle post(bool send, void* buf, size_t bytes, int peer, int tag, Handle after, ncclComm_t comm,
              cudaStream_t stream) {
    const Handle h = take_slot(peer, tag, send);
    Slot& s = slots_[size_t(h)];
    enqueue_after_compute(s, stream);
    if (after != kNone) CUDA_CHECK(cudaStreamWaitEvent(stream, slot(after).done, 0));
    mark(s.t_begin, stream);
    const char* op = send ? "ncclSend" : "ncclRecv";
    const char* way = send ? " to " : " from ";
    const ncclResult_t rc = send ? ncclSend(buf, bytes, ncclUint8, peer, comm, stream)
                                 : ncclRecv(buf, bytes, ncclUint8, peer, comm, stream);
    comms_.check_call(comm, rc, cat(op, " of ", bytes, " bytes", way, world_.rank_name(peer)));
    comms_.settle(comm, cat(op, way, world_.rank_name(peer)), timeout_s_);
    mark(s.t_end, stream);
    CUDA_CHECK(cudaEventRecord(s.done, stream));
    return h;
  }

  // The op's stream waits for the work queued on the compute stream so far.
  void enqueue_after_compute(Slot& s, cudaStream_t stream) {
    CUDA_CHECK(cudaSetDevice(device_));
    exec_.record_event(s.ready);
    CUDA_CHECK(cudaStreamWaitEvent(stream, s.ready, 0));
  }

  // A timing event on `stream` when tracing (created on first use).
  void mark(cudaEvent_t& e, cudaStream_t stream) {
    if (!tracing_ || !timeline_) return;
    if (!e) CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, stream));
  }

  void record_span(const Slot& s) {
    if (!s.t_begin || !s.t_end) return;
    float b = 0, e = 0;
    CUDA_CHECK(cudaEventElapsedTime(&b, timeline_(), s.t_begin));
    CUDA_CHECK(cudaEventElapsedTime(&e, timeline_(), s.t_end));
    spans_.push_back({s.is_send ? Track::kSend : Track::kRecv, s.is_send ? "send" : "recv", int64_t(s.tag),
                      double(b) / 1000.0, double(e) / 1000.0});
  }

  // Warm-up: rank r sends to r+1 and receives from r-1 (different communicators, no deadlock), and
  // the feedback link carries one message, so that the first real transfer pays no connection.
  void warm_up(double init_s) {
    char* send_buf = static_cast<char*>(warm_);
    char* recv_buf = send_buf + kWarmupBytes;
    if (!world_.is_last()) warm(true, send_buf, world_.next(), comms_.send(), send_stream_, "the warm-up send", init_s);
    if (!world_.is_first())
      warm(false, recv_buf, world_.prev(), comms_.recv(), recv_stream_, "the warm-up receive", init_s);
    if (world_.is_last()) warm(true, send_buf, 0, comms_.feedback(), fb_stream_, "the warm-up feedback send", init_s);
    if (world_.is_first())
      warm(false, recv_buf, world_.size - 1, comms_.feedback(), fb_stream_, "the warm-up feedback receive", init_s);
    if (!poll_until([&] { return stream_idle(send_stream_) && stream_idle(recv_stream_) && stream_idle(fb_stream_); },
                    init_s))
      comms_.fail(cat("timed out after ", init_s, " s in the warm-up exchange with the neighbouring ranks",
                      " (did a rank stop? see --timeout)"));
  }

  void warm(bool send, char* buf, int peer, ncclComm_t comm, cudaStream_t stream, const char* what, double init_s) {
    const ncclResult_t rc = send ? ncclSend(buf, kWarmupBytes, ncclUint8, peer, comm, stream)
                                 : ncclRecv(buf, kWarmupBytes, ncclUint8, peer, comm, stream);
    comms_.check_call(comm, rc, what);
    comms_.settle(comm, what, init_s);
  }

  bool stream_idle(cudaStream_t stream) {
    comms_.check_async("the warm-up exchange");
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      comms_.fail(cat("the warm-up exchange: CUDA error ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    }
    return true;
  }

  WorldConfig world_;
  CudaStageExecutor& exec_;
  int device_;
  cudaStream_t send_stream_ = nullptr, recv_stream_ = nullptr, fb_stream_ = nullptr;
  NcclComms comms_;
  bool connected_ = false, tracing_ = false;
  std::function<CUevent_st*()> timeline_;  // the run's GPU time zero (--trace)
  void* warm_ = nullptr;
  std::vector<Slot> slots_;
  std::vector<TraceSpan> spans_;
};

}  // namespace

std::unique_ptr<NcclTransport> make_nccl_transport(const WorldConfig& world, CudaStageExecutor& exec,
                                                   double timeout_s) {
  return std::make_unique<NcclTransportImpl>(world, exec, timeout_s);
}

}  // namespace lfm2
