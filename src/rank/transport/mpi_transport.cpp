// The MPI transport: MPI_Isend / MPI_Irecv of host hidden-state buffers, waits that poll MPI_Test.
#include <climits>
#include <vector>

#include "common/error.h"
#include "rank/mpi/world.h"
#include "rank/transport/transport.h"

namespace lfm2 {
namespace {

class MpiTransport final : public Transport {
 public:
  MpiTransport(const WorldConfig& world, double timeout_s) : world_(world) { timeout_s_ = timeout_s; }

  ~MpiTransport() override {
    // Only reached with requests pending when the job is being torn down after an error.
    for (auto& s : slots_)
      if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);
  }

  const char* name() const override { return "mpi"; }
  bool accepts_device_memory() const override { return false; }

  Handle isend(const void* buf, size_t bytes, int peer, int tag) override {
    Handle h = take_slot(peer, true);
    MPI_CHECK(MPI_Isend(buf, count_of(bytes), MPI_BYTE, peer, tag, world_.comm, &slots_[h].req), "MPI_Isend of ", bytes,
              " bytes to ", world_.rank_name(peer));
    return h;
  }

  Handle irecv(void* buf, size_t bytes, int peer, int tag, Handle after) override {
    LFM2_CHECK(after == kNone, "mpi transport: a receive cannot be ordered after a pending send (wait for it first)");
    Handle h = take_slot(peer, false);
    slots_[h].bytes = bytes;
    MPI_CHECK(MPI_Irecv(buf, count_of(bytes), MPI_BYTE, peer, tag, world_.comm, &slots_[h].req), "MPI_Irecv of ", bytes,
              " bytes from ", world_.rank_name(peer));
    return h;
  }

  bool test(Handle h) override {
    Slot& s = slot(h);
    if (!s.done) advance(s);
    if (!s.done) return false;
    LFM2_CHECK(s.is_send || s.got == s.bytes, "received ", s.got, " bytes from ", world_.rank_name(s.peer),
               ", expected ", s.bytes);
    s.used = false;
    return true;
  }

  void progress() override {
    for (auto& s : slots_)
      if (s.used && !s.done) advance(s);
  }

  void wait(Handle h, const std::string& what) override {
    const Slot& s = slot(h);
    const int peer = s.peer;
    const bool is_send = s.is_send;
    if (poll_until([&] { return test(h); }, timeout_s_)) return;
    if (is_send)
      LFM2_SEND_TIMEOUT("timed out after ", timeout_s_, " s waiting to send ", what, " to ", world_.rank_name(peer),
                        " (did it stop? see --timeout)");
    LFM2_TIMEOUT("timed out after ", timeout_s_, " s waiting to receive ", what, " from ", world_.rank_name(peer),
                 " (did it stop? see --timeout)");
  }

 private:
  struct Slot {
    MPI_Request req = MPI_REQUEST_NULL;
    int peer = -1;
    bool is_send = false, used = false, done = false;
    size_t bytes = 0, got = 0;  // expected and received sizes of a receive
  };

  // One MPI_Test; records completion (and a receive's size) without releasing the slot.
  void advance(Slot& s) {
    int flag = 0;
    MPI_Status status;
    MPI_CHECK(MPI_Test(&s.req, &flag, &status), s.is_send ? "send to " : "receive from ", world_.rank_name(s.peer));
    if (!flag) return;
    s.done = true;
    if (!s.is_send) {
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      s.got = size_t(got);
    }
  }

  static int count_of(size_t bytes) {
    LFM2_CHECK(bytes <= size_t(INT_MAX), "message of ", bytes,
               " bytes is over MPI's int count; use smaller microbatches");
    return int(bytes);
  }

  Handle take_slot(int peer, bool is_send) {
    LFM2_CHECK(peer >= 0 && peer < world_.size && peer != world_.rank, "transport: bad peer rank ", peer);
    size_t i = 0;
    while (i < slots_.size() && slots_[i].used) ++i;
    if (i == slots_.size()) slots_.emplace_back();
    slots_[i] = Slot{MPI_REQUEST_NULL, peer, is_send, true, false, 0, 0};
    return Handle(i);
  }

  Slot& slot(Handle h) {
    LFM2_CHECK(h >= 0 && size_t(h) < slots_.size() && slots_[h].used, "transport: stale handle ", h);
    return slots_[h];
  }

  WorldConfig world_;
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const WorldConfig& world, double timeout_s) {
  return std::make_unique<MpiTransport>(world, timeout_s);
}

void Transport::order_compute_after(Handle) {
  LFM2_FAIL("the ", name(), " transport moves host buffers: wait for the operation instead of ordering after it");
}

}  // namespace lfm2
