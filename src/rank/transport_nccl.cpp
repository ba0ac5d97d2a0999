// The NCCL transport (see cuda_rank.h): ncclSend / ncclRecv of device hidden-state buffers on a
// communication stream, ordered against the executor's compute stream by CUDA events.
//
// isend(buf):  compute stream --record(ready)--> comm stream waits(ready), ncclSend, record(done).
//              The send starts once the compute that wrote buf is done.
// irecv(buf):  the same: the receive into buf starts once the compute queued so far (the last reader
//              of buf) is done; sends and receives share the comm stream, so a receive into a buffer
//              also follows the send out of it.
// test/wait:   poll cudaEventQuery(done) and ncclCommGetAsyncError; a completed receive makes the
//              compute stream wait on its done event before the handle is released, so whatever the
//              pipeline queues next on the compute stream reads the received data.
// On an NCCL error or a timeout the communicator is aborted (ncclCommAbort: nothing of it can hang
// any more) and lfm2::Error is thrown; lfm2-rank then ends the job with MPI_Abort.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/log.h"
#include "rank/cuda_rank.h"

namespace lfm2 {
namespace {

constexpr size_t kWarmupBytes = size_t(1) << 20;  // per direction
// Creating a communicator takes seconds (topology discovery, connections): its deadline is --timeout
// but never under this, so that a short --timeout meant for stalled peers does not fail a healthy init.
constexpr double kMinInitTimeoutS = 60;

class NcclTransportImpl final : public NcclTransport {
 public:
  NcclTransportImpl(const WorldConfig& world, CudaStageExecutor& exec, double timeout_s)
      : world_(world), exec_(exec), device_(exec.device()) {
    timeout_s_ = timeout_s;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Allocated before the communicator, like every other buffer of the run.
    CUDA_CHECK(cudaMalloc(&warm_, 2 * kWarmupBytes));
    CUDA_CHECK(cudaMemsetAsync(warm_, 0, 2 * kWarmupBytes, stream_));
  }

  ~NcclTransportImpl() override {
    cudaSetDevice(device_);
    if (comm_) {
      // A clean end: every operation has completed. Finalize flushes NCCL's own work, then destroy.
      const ncclResult_t rc = ncclCommFinalize(comm_);
      const bool clean = (rc == ncclSuccess || rc == ncclInProgress) &&
                         poll_until([&] { return state() != ncclInProgress; }, 30) && state() == ncclSuccess;
      if (clean)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& s : slots_) {
      if (s.ready) cudaEventDestroy(s.ready);
      if (s.done) cudaEventDestroy(s.done);
    }
    if (warm_) cudaFree(warm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }
  bool accepts_device_memory() const override { return true; }

  void connect() override {
    LFM2_CHECK(!comm_, "nccl: connect() called twice");
    // NVLink SHARP (NVLS) multicast buys nothing for point-to-point and its set-up fails on some
    // machines; the user's environment wins when it says otherwise.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (world_.is_first()) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(&id, int(sizeof id), MPI_BYTE, 0, world_.comm, &req), "broadcasting the NCCL unique id");
    wait_mpi_request(&req, timeout_s_, "broadcasting the NCCL unique id");

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and every call return at once; we poll with a deadline instead
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, world_.size, id, world_.rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const std::string msg = ncclGetErrorString(rc);
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      LFM2_FAIL("nccl: creating the communicator of ", world_.size, " ranks on GPU ", device_, " failed: ", msg);
    }
    const double init_s = std::max(timeout_s_, kMinInitTimeoutS);
    settle(cat("creating the NCCL communicator of ", world_.size, " ranks on GPU ", device_), init_s);

    // Warm-up: rank r sends to r+1 and receives from r-1 in one group (no ordering deadlock).
    char* send_buf = static_cast<char*>(warm_);
    char* recv_buf = send_buf + kWarmupBytes;
    check_call(ncclGroupStart(), "the warm-up exchange");
    if (!world_.is_last())
      check_call(ncclSend(send_buf, kWarmupBytes, ncclUint8, world_.next(), comm_, stream_), "the warm-up send");
    if (!world_.is_first())
      check_call(ncclRecv(recv_buf, kWarmupBytes, ncclUint8, world_.prev(), comm_, stream_), "the warm-up receive");
    check_call(ncclGroupEnd(), "the warm-up exchange");
    settle("the warm-up exchange", init_s);
    if (world_.size > 1) {
      if (!poll_until([&] { return stream_idle("the warm-up exchange"); }, init_s))
        fail(cat("timed out after ", init_s, " s in the warm-up exchange with the neighbouring ranks",
                 " (did a rank stop? see --timeout)"));
    }
  }

  Handle isend(const void* buf, size_t bytes, int peer, int tag) override {
    (void)tag;  // NCCL has no tags; messages between two ranks keep their order
    const Handle h = take_slot(peer, true);
    Slot& s = slots_[size_t(h)];
    enqueue_after_compute(s);
    check_call(ncclSend(buf, bytes, ncclUint8, peer, comm_, stream_), cat("ncclSend of ", bytes, " bytes to rank ", peer));
    settle(cat("ncclSend to rank ", peer));
    CUDA_CHECK(cudaEventRecord(s.done, stream_));
    return h;
  }

  Handle irecv(void* buf, size_t bytes, int peer, int tag) override {
    (void)tag;
    const Handle h = take_slot(peer, false);
    Slot& s = slots_[size_t(h)];
    enqueue_after_compute(s);
    check_call(ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream_),
               cat("ncclRecv of ", bytes, " bytes from rank ", peer));
    settle(cat("ncclRecv from rank ", peer));
    CUDA_CHECK(cudaEventRecord(s.done, stream_));
    return h;
  }

  bool test(Handle h) override {
    Slot& s = slot(h);
    check_async(s.is_send ? cat("sending to rank ", s.peer) : cat("receiving from rank ", s.peer));
    const cudaError_t e = cudaEventQuery(s.done);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(cat(s.is_send ? "sending to rank " : "receiving from rank ", s.peer, ": CUDA error ", cudaGetErrorName(e),
               ": ", cudaGetErrorString(e)));
    }
    if (!s.is_send) exec_.wait_event(s.done);  // the compute that reads the data follows the receive
    s.used = false;
    return true;
  }

  void wait(Handle h, const std::string& what) override {
    const Slot& s = slot(h);
    const int peer = s.peer;
    const bool is_send = s.is_send;
    if (!poll_until([&] { return test(h); }, timeout_s_))
      fail(cat("timed out after ", timeout_s_, " s waiting to ", is_send ? "send " : "receive ", what,
               is_send ? " to rank " : " from rank ", peer, " (did it stop? see --timeout)"));
  }

 private:
  struct Slot {
    cudaEvent_t ready = nullptr, done = nullptr;  // compute done (before the op), op done
    int peer = -1;
    bool is_send = false, used = false;
  };

  Handle take_slot(int peer, bool is_send) {
    LFM2_CHECK(comm_, "nccl: the transport is not connected");
    LFM2_CHECK(peer >= 0 && peer < world_.size && peer != world_.rank, "transport: bad peer rank ", peer);
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
    s.is_send = is_send;
    s.used = true;
    return Handle(i);
  }

  Slot& slot(Handle h) {
    LFM2_CHECK(h >= 0 && size_t(h) < slots_.size() && slots_[size_t(h)].used, "transport: stale handle ", h);
    return slots_[size_t(h)];
  }

  // The comm stream waits for the work queued on the compute stream so far.
  void enqueue_after_compute(Slot& s) {
    CUDA_CHECK(cudaSetDevice(device_));
    exec_.record_event(s.ready);
    CUDA_CHECK(cudaStreamWaitEvent(stream_, s.ready, 0));
  }

  ncclResult_t state() {
    ncclResult_t st = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
    return rc == ncclSuccess ? st : rc;
  }

  // An NCCL call's own return code: in progress is fine (settle() follows), anything else aborts.
  void check_call(ncclResult_t rc, const std::string& what) {
    if (rc != ncclSuccess && rc != ncclInProgress)
      fail(cat("nccl: ", what, ": ", ncclGetErrorString(rc), " (", ncclGetLastError(comm_), ")"));
  }

  void check_async(const std::string& what) {
    const ncclResult_t st = state();
    if (st != ncclSuccess && st != ncclInProgress)
      fail(cat("nccl: ", what, ": ", ncclGetErrorString(st), " (", ncclGetLastError(comm_), ")"));
  }

  // A non-blocking communicator may still be working on the last call; wait (with the deadline)
  // until it has taken it, as NCCL requires before the next call.
  void settle(const std::string& what) { settle(what, timeout_s_); }
  void settle(const std::string& what, double timeout_s) {
    bool failed = false;
    const bool done = poll_until(
        [&] {
          const ncclResult_t st = state();
          failed = st != ncclSuccess && st != ncclInProgress;
          return st != ncclInProgress;
        },
        timeout_s);
    if (failed) check_async(what);
    if (!done) fail(cat("timed out after ", timeout_s, " s in ", what, " (did a rank stop? see --timeout)"));
  }

  bool stream_idle(const std::string& what) {
    check_async(what);
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(cat(what, ": CUDA error ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
    }
    return true;
  }

  // Aborts the communicator (so that no NCCL kernel or proxy waits on a peer any more) and throws.
  [[noreturn]] void fail(const std::string& msg) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    LFM2_FAIL(msg);
  }

  WorldConfig world_;
  CudaStageExecutor& exec_;
  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* warm_ = nullptr;
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<NcclTransport> make_nccl_transport(const WorldConfig& world, CudaStageExecutor& exec,
                                                   double timeout_s) {
  return std::make_unique<NcclTransportImpl>(world, exec, timeout_s);
}

}  // namespace lfm2
