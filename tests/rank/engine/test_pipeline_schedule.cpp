// The GPipe schedule without MPI: P threads, each a stage with a fake executor, joined by an
// in-process transport. Checks that every P and microbatch size gives the one-stage results bit
// for bit, that each stage sees every microbatch once and in order, and that a wait for a peer
// that never sends ends with an error instead of hanging. A "device" flavour (on_device() true, a
// BusyTimer) takes the pipeline's GPU path: no synchronisation per step, busy time from the timer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "kernels/argmax.h"
#include "plan/layer_partition.h"
#include "rank/engine/pipeline.h"
#include "rank/jobs/generate_job.h"
#include "rank/jobs/score_job.h"
#include "rank/mpi/world.h"

namespace lfm2 {
namespace {

constexpr int64_t kHidden = 3, kVocab = 7, kLayers = 6;

// Layer il maps x -> x * (1 + 1/(il+2)) + il; the head scores v as sum_c x[c] * (v - c).
class FakeStage final : public StageExecutor {
 public:
  FakeStage(int begin, int end, bool first, bool last, bool device = false)
      : begin_(begin), end_(end), first_(first), last_(last), device_(device) {}
  DType act_dtype() const override { return DType::F32; }
  bool on_device() const override { return device_; }
  int64_t weight_bytes() const override { return 0; }
  void* alloc_hidden(int64_t max_tokens) override {
    bufs_.emplace_back(size_t(max_tokens * kHidden));
    return bufs_.back().data();
  }
  void* alloc_host(int64_t bytes) override {
    host_.emplace_back(size_t(bytes));
    return host_.back().data();
  }
  void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) override {
    EXPECT_TRUE(first_);
    float* h = static_cast<float*>(x);
    for (int64_t t = 0; t < n_seq * seq_len; ++t)
      for (int64_t c = 0; c < kHidden; ++c) h[t * kHidden + c] = float(ids[t]) * 0.25f + float(c);
  }
  void forward(void* x, int64_t n_seq, int64_t seq_len) override {
    float* h = static_cast<float*>(x);
    for (int il = begin_; il < end_; ++il)
      for (int64_t i = 0; i < n_seq * seq_len * kHidden; ++i) h[i] = h[i] * (1.0f + 1.0f / float(il + 2)) + float(il);
    seen_.push_back(n_seq);
    if (on_forward) on_forward();
  }
  void head(const void* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) override {
    EXPECT_TRUE(last_);
    std::vector<float> last(size_t(n_seq * kVocab));
    scores(x, n_seq, seq_len, false, last.data(), lengths);
    if (out.logits) std::copy(last.begin(), last.end(), out.logits);
    if (out.all_logits) scores(x, n_seq, seq_len, true, out.all_logits);
    std::vector<float> margin(static_cast<size_t>(n_seq));
    cpu::argmax_margin(out.next_token, margin.data(), last.data(), n_seq, kVocab);
    if (out.margin) std::copy(margin.begin(), margin.end(), out.margin);
  }
  void synchronize() override { ++syncs_; }
  std::vector<int64_t> seen_;  // microbatch sizes, in the order forward() ran them
  int syncs_ = 0;
  std::function<void()> on_forward;  // called after each forward()

 private:
  static void scores(const void* x, int64_t n_seq, int64_t seq_len, bool all_positions, float* logits,
                     const int32_t* lengths = nullptr) {
    const float* h = static_cast<const float*>(x);
    const int64_t rows = all_positions ? n_seq * seq_len : n_seq;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = all_positions ? r : r * seq_len + (lengths ? lengths[r] : seq_len) - 1;
      for (int64_t v = 0; v < kVocab; ++v) {
        float s = 0;
        for (int64_t c = 0; c < kHidden; ++c) s += h[t * kHidden + c] * float(v - c);
        logits[r * kVocab + v] = s;
      }
    }
  }

  int begin_, end_;
  bool first_, last_, device_;
  std::deque<std::vector<float>> bufs_;
  std::deque<std::vector<char>> host_;
};

// Every message is delivered at once into a per-(from, to) queue: eager sends, polled receives.
struct Hub {
  std::mutex mu;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> queues;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(Hub& hub, int rank, double timeout_s, bool device = false)
      : hub_(hub), rank_(rank), device_(device) {
    timeout_s_ = timeout_s;
  }
  const char* name() const override { return "loopback"; }
  bool accepts_device_memory() const override { return device_; }
  Handle isend(const void* buf, size_t bytes, int peer, int) override {
    std::lock_guard<std::mutex> lock(hub_.mu);
    const char* p = static_cast<const char*>(buf);
    hub_.queues[{rank_, peer}].emplace_back(p, p + bytes);
    ops_.push_back({nullptr, bytes, peer, true, true});
    return Handle(ops_.size() - 1);
  }
  Handle irecv(void* buf, size_t bytes, int peer, int tag, Handle after) override {
    if (after != kNone) {
      EXPECT_TRUE(device_) << "a host transport gets no `after`";
      EXPECT_TRUE(ops_.at(size_t(after)).is_send && !ops_.at(size_t(after)).released) << "after: a pending send";
    }
    ++posted_recvs;
    if (on_irecv) on_irecv(peer, tag);
    ops_.push_back({buf, bytes, peer, false, false});
    return Handle(ops_.size() - 1);
  }
  bool test(Handle h) override {
    Op& op = ops_.at(size_t(h));
    EXPECT_FALSE(op.released) << "handle " << h << " used after its release";
    if (!deliver(op)) return false;
    return op.released = true;
  }
  // The fake executor computes at once, so ordering the compute after a receive means having its
  // data now: poll for it (without releasing the handle, as a device transport would not).
  void order_compute_after(Handle h) override {
    EXPECT_TRUE(device_);
    Op& op = ops_.at(size_t(h));
    EXPECT_FALSE(op.released);
    if (!poll_until([&] { return deliver(op); }, timeout_s_)) LFM2_FAIL("timed out waiting for data");
  }
  // Handles never released by a successful test() (sends are complete at once but must still be
  // tested or waited for).
  size_t unreleased() const {
    size_t n = 0;
    for (const Op& op : ops_) n += op.released ? 0 : 1;
    return n;
  }
  void wait(Handle h, const std::string& what) override {
    ++waits;
    if (!poll_until([&] { return test(h); }, timeout_s_)) LFM2_FAIL("timed out waiting for ", what);
  }
  int waits = 0, posted_recvs = 0;
  std::function<void(int peer, int tag)> on_irecv;  // called as each receive is posted

 private:
  struct Op {
    void* buf;
    size_t bytes;
    int peer;
    bool is_send;
    bool done = false;
    bool released = false;
  };
  bool deliver(Op& op) {
    if (op.done) return true;
    std::lock_guard<std::mutex> lock(hub_.mu);
    auto& q = hub_.queues[{op.peer, rank_}];
    if (q.empty()) return false;
    LFM2_CHECK(q.front().size() == op.bytes, "loopback: size mismatch");
    std::memcpy(op.buf, q.front().data(), op.bytes);
    q.pop_front();
    op.done = true;
    return true;
  }

  Hub& hub_;
  int rank_;
  bool device_;
  std::vector<Op> ops_;
};

// Counts the steps it brackets and reports a fixed busy time.
class CountingTimer final : public BusyTimer {
 public:
  void reset() override { begins = ends = 0; }
  void begin(const char* what, int64_t micro) override {
    EXPECT_EQ(begins, ends);
    ++begins;
    spans_.push_back({Track::kCompute, what, micro, 0.25 * begins, 0.25 * begins + 0.25});
  }
  void end() override { ++ends; }
  double busy_s() override { return 0.25 * ends; }
  std::vector<TraceSpan> spans() override { return spans_; }
  int64_t n_steps() const override { return ends; }
  bool step_done(int64_t k) override { return k < ends; }
  int begins = 0, ends = 0;
  std::vector<TraceSpan> spans_;
};

struct RunOut {
  PipelineResult result;
  std::vector<std::vector<int64_t>> seen;  // per rank
  std::vector<int> syncs, steps;           // per rank: synchronize() calls, timed steps (device)
  std::vector<double> busy_s;              // per rank
  std::vector<size_t> unreleased;          // per rank: transport handles never released
  // per rank, at each forward(): the host waits so far and the receives posted so far
  std::vector<std::vector<int>> waits_at_forward, posted_at_forward;
};

RunOut run_pipeline(const std::vector<int>& counts, int64_t n_seq, int64_t seq_len, int64_t microbatch,
                    bool all_logits, bool device = false, std::vector<int32_t> lengths = {}) {
  std::vector<int32_t> ids(size_t(n_seq * seq_len));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % 101);
  const auto stages = make_stages(counts);
  const int P = int(stages.size());
  Hub hub;
  RunOut out;
  out.seen.resize(size_t(P));
  out.syncs.resize(size_t(P));
  out.steps.resize(size_t(P));
  out.busy_s.resize(size_t(P));
  out.unreleased.resize(size_t(P));
  out.waits_at_forward.resize(size_t(P));
  out.posted_at_forward.resize(size_t(P));
  std::vector<std::thread> threads;
  std::mutex err_mu;
  std::string error;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      try {
        WorldConfig w;
        w.rank = r;
        w.size = P;
        const StageLayers& p = stages[size_t(r)];
        FakeStage stage(p.layer_begin, p.layer_end, p.is_first(), p.is_last(), device);
        LoopbackTransport transport(hub, r, 10.0, device);
        stage.on_forward = [&out, &transport, r] {
          out.waits_at_forward[size_t(r)].push_back(transport.waits);
          out.posted_at_forward[size_t(r)].push_back(transport.posted_recvs);
        };
        CountingTimer timer;
        const PipelineShape shape{n_seq, seq_len, microbatch, kHidden, kVocab, true, all_logits, lengths};
        Pipeline pipe(w, stage, transport, kHidden, shape.max_micro_tokens());
        ScoreJob job(w, stage, shape);
        if (device) pipe.set_busy_timer(&timer);
        job.set_ids(ids.data());
        const StageTiming t = pipe.run(job.schedule(), job.memory());
        if (p.is_last()) job.take_results(&out.result);
        out.seen[size_t(r)] = stage.seen_;
        out.syncs[size_t(r)] = stage.syncs_;
        out.steps[size_t(r)] = timer.ends;
        out.busy_s[size_t(r)] = t.busy_s;
        out.unreleased[size_t(r)] = transport.unreleased();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(err_mu);
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(error, "");
  return out;
}

TEST(PipelineSchedule, EveryRankCountAndMicrobatchGivesTheSameBits) {
  const RunOut ref = run_pipeline({int(kLayers)}, 10, 4, 10, true);
  ASSERT_EQ(ref.result.next_token.size(), 10u);
  ASSERT_EQ(ref.result.all_logits.size(), size_t(10 * 4 * kVocab));
  // The head's last-position logits equal all_logits at the last position.
  EXPECT_EQ(0, std::memcmp(ref.result.logits.data(), ref.result.all_logits.data() + 3 * kVocab, kVocab * 4));
  for (const std::vector<int>& counts : {std::vector<int>{3, 3}, {1, 5}, {2, 2, 2}, {1, 1, 1, 3}, {1, 1, 1, 1, 1, 1}}) {
    for (int64_t mb : {1, 3, 4, 10}) {
      const RunOut got = run_pipeline(counts, 10, 4, mb, true);
      const int64_t M = (10 + mb - 1) / mb;
      EXPECT_EQ(got.result.next_token, ref.result.next_token) << counts.size() << " ranks, microbatch " << mb;
      EXPECT_EQ(0, std::memcmp(got.result.logits.data(), ref.result.logits.data(), ref.result.logits.size() * 4));
      EXPECT_EQ(
          0, std::memcmp(got.result.all_logits.data(), ref.result.all_logits.data(), ref.result.all_logits.size() * 4));
      for (const auto& seen : got.seen) {
        ASSERT_EQ(int64_t(seen.size()), M);         // each stage ran every microbatch once
        EXPECT_EQ(seen.back(), 10 - (M - 1) * mb);  // in order: the short one last
      }
    }
  }
}

TEST(PipelineSchedule, DeviceExecutorsQueueWithoutSynchronisingAndTimeWithTheirTimer) {
  const RunOut ref = run_pipeline({int(kLayers)}, 10, 4, 10, true);
  for (const std::vector<int>& counts : {std::vector<int>{int(kLayers)}, {3, 3}, {1, 1, 1, 3}}) {
    for (int64_t mb : {1, 3, 10}) {
      const RunOut got = run_pipeline(counts, 10, 4, mb, true, /*device=*/true);
      const int P = int(counts.size());
      const int M = int((10 + mb - 1) / mb);
      EXPECT_EQ(got.result.next_token, ref.result.next_token) << P << " ranks, microbatch " << mb;
      EXPECT_EQ(
          0, std::memcmp(got.result.all_logits.data(), ref.result.all_logits.data(), ref.result.all_logits.size() * 4));
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(got.syncs[size_t(r)], 1) << "rank " << r;  // once, at the end of the run
        // forward on every rank, embed on the first, head on the last: one timed step each.
        const int steps = M * (1 + (r == 0 ? 1 : 0) + (r == P - 1 ? 1 : 0));
        EXPECT_EQ(got.steps[size_t(r)], steps) << "rank " << r;
        EXPECT_DOUBLE_EQ(got.busy_s[size_t(r)], 0.25 * steps);
        EXPECT_EQ(got.unreleased[size_t(r)], 0u) << "rank " << r;  // every send and receive completed
      }
    }
  }
  // The host path synchronises after every step and releases every handle too.
  const RunOut cpu = run_pipeline({3, 3}, 10, 4, 3, true);
  EXPECT_EQ(cpu.syncs[0], 2 * 4);
  EXPECT_EQ(cpu.unreleased[0] + cpu.unreleased[1], 0u);
}

// The device path only queues: no host wait before the end of the run, and while microbatch m is
// computed the receives of m+1 and m+2 are already posted (three buffers: compute m, receive m+1,
// send m-1).
TEST(PipelineSchedule, DeviceHostNeverWaitsAndReceivesRunAhead) {
  for (int64_t mb : {1, 2}) {
    const RunOut got = run_pipeline({2, 2, 2}, 10, 4, mb, false, /*device=*/true);
    const int M = int((10 + mb - 1) / mb);
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(int(got.waits_at_forward[size_t(r)].size()), M);
      for (int m = 0; m < M; ++m) {
        EXPECT_EQ(got.waits_at_forward[size_t(r)][size_t(m)], 0) << "rank " << r << " microbatch " << m;
        if (r > 0) {
          EXPECT_EQ(got.posted_at_forward[size_t(r)][size_t(m)], std::min(M, m + 3)) << "rank " << r;
        }
      }
    }
  }
  // The host path waits for each receive before computing it, and posts ahead what it can.
  const RunOut cpu = run_pipeline({2, 2, 2}, 10, 4, 1, false);
  EXPECT_GE(cpu.waits_at_forward[1].back(), 10);
  for (int m = 0; m < 10; ++m) EXPECT_GE(cpu.posted_at_forward[1][size_t(m)], m + 1);
}

// Ragged prompts: the head reads each sequence's own last position, whatever P and the microbatch.
TEST(PipelineSchedule, RaggedPromptsUseTheirOwnLastPosition) {
  const std::vector<int32_t> lengths = {4, 1, 3, 2, 4, 1, 2};
  for (const std::vector<int>& counts : {std::vector<int>{int(kLayers)}, {2, 4}, {1, 2, 3}})
    for (int64_t mb : {1, 3, 7})
      for (bool device : {false, true}) {
        const RunOut r = run_pipeline(counts, 7, 4, mb, true, device, lengths);
        for (int64_t s = 0; s < 7; ++s)
          EXPECT_EQ(0, std::memcmp(r.result.logits.data() + s * kVocab,
                                   r.result.all_logits.data() + (s * 4 + lengths[size_t(s)] - 1) * kVocab,
                                   kVocab * sizeof(float)))
              << counts.size() << " ranks, microbatch " << mb << ", sequence " << s;
      }
}

TEST(PipelineSchedule, MarginIsTheGapToTheRunnerUp) {
  const RunOut r = run_pipeline({3, 3}, 5, 2, 2, false);
  ASSERT_EQ(r.result.margin.size(), 5u);
  for (int64_t s = 0; s < 5; ++s) {
    std::vector<float> row(r.result.logits.begin() + s * kVocab, r.result.logits.begin() + (s + 1) * kVocab);
    std::sort(row.rbegin(), row.rend());
    EXPECT_EQ(r.result.margin[size_t(s)], row[0] - row[1]);
  }
}

TEST(PipelineSchedule, TopOneIsTheFirstMaximum) {
  const RunOut r = run_pipeline({3, 3}, 5, 2, 2, false);
  for (int64_t s = 0; s < 5; ++s) {
    const float* row = r.result.logits.data() + s * kVocab;
    int best = 0;
    for (int v = 1; v < kVocab; ++v)
      if (row[v] > row[best]) best = v;
    EXPECT_EQ(r.result.next_token[size_t(s)], best);
  }
  EXPECT_TRUE(r.result.all_logits.empty());
}

// Generation's shape of work on a fake executor: item i is step i / M of microbatch i % M (one
// sequence each), and its input is what the last stage chose from item i - M (sent back to the
// first stage). The prompt of sequence m is the token m; each stage adds 1 to the row; the last
// stage chooses twice the row as the next token and reports the row itself.
class FeedbackStage final : public StageExecutor {
 public:
  DType act_dtype() const override { return DType::F32; }
  bool on_device() const override { return true; }
  int64_t weight_bytes() const override { return 0; }
  void* alloc_hidden(int64_t max_tokens) override { return alloc_host(max_tokens * kHidden * int64_t(sizeof(float))); }
  void* alloc_host(int64_t bytes) override {
    host_.emplace_back(size_t(bytes));
    return host_.back().data();
  }
  int32_t* alloc_tokens(int64_t n) override { return static_cast<int32_t*>(alloc_host(n * int64_t(sizeof(int32_t)))); }
  void alloc_batch_state(const StateShape&, const SamplingParams&) override {}
  void map_pages(int64_t, int64_t, const int32_t*, int64_t) override {}
  void embed(const int32_t*, int64_t, int64_t, void*) override { ADD_FAILURE() << "generation runs batch steps"; }
  void embed_batch(const StepBatch& b, const int32_t* prompt_ids, const int32_t* fed, void* x) override {
    EXPECT_EQ(b.seqs.size(), 1u);
    const bool decode = b.n_decode() == 1;
    *static_cast<float*>(x) = float(decode ? fed[0] : prompt_ids[0]);
    if (decode) decode_flags(x, b.rows(), kHidden)[0] = 0;
  }
  void forward(void*, int64_t, int64_t) override { ADD_FAILURE() << "generation runs batch steps"; }
  void forward_batch(void* x, const StepBatch&) override { layers(x); }
  void head(const void*, int64_t, int64_t, const int32_t*, const HeadOutputs&) override {
    ADD_FAILURE() << "generation chooses tokens";
  }
  void choose_batch(const void* x, const StepBatch&, const SeqSampling*, int32_t* tokens, int32_t* host) override {
    const float v = *static_cast<const float*>(x);
    tokens[0] = int32_t(2 * v);
    host[0] = int32_t(v);
  }
  void synchronize() override {}

  int64_t queued = 0;  // items whose layers this stage has queued

 private:
  void layers(void* x) {
    *static_cast<float*>(x) += 1;
    ++queued;
  }
  std::deque<std::vector<char>> host_;
};

// With fewer microbatches than buffers, a receive posted ahead could be for an item whose input
// needs feedback this very stage has yet to produce; on a GPU its kernel then spins for data that
// only this host's next steps release, and a CUDA call that waits for the whole device (a module
// loaded on first use) never returns. A stage posts a receive only once it has queued the item
// that receive depends on; the results stay those of one stage.
TEST(PipelineSchedule, ReceivesAheadNeverWaitOnFeedbackNotYetQueued) {
  for (int P : {2, 3}) {
    for (int64_t M : {1, 2, 3, 5}) {
      const int64_t steps = 4;
      std::vector<float> want(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m) {
        float v = float(m);
        for (int64_t t = 0; t + 1 < steps; ++t) v = 2 * (v + float(P));
        want[size_t(m)] = v + float(P);
      }
      Hub hub;
      std::vector<float> got;
      std::vector<std::string> errors(static_cast<size_t>(P));
      std::vector<std::thread> threads;
      for (int r = 0; r < P; ++r) {
        threads.emplace_back([&, r] {
          try {
            WorldConfig w;
            w.rank = r;
            w.size = P;
            FeedbackStage stage;
            LoopbackTransport transport(hub, r, 10.0, /*device=*/true);
            CountingTimer timer;
            const GenerateShape shape{M, 1, 1, kHidden, steps, {}};
            GenerateJob job(w, stage, shape, SamplingParams{});
            std::vector<int32_t> ids(static_cast<size_t>(M));
            for (int64_t m = 0; m < M; ++m) ids[size_t(m)] = int32_t(m);
            job.set_ids(ids.data());
            transport.on_irecv = [&](int peer, int tag) {
              if (peer != r - 1) return;  // the hidden states from the previous stage
              EXPECT_LT(job.schedule()[size_t(tag)].feedback_from, stage.queued)
                  << "rank " << r << " of " << P << ", " << M << " microbatches: item " << tag
                  << " received ahead of its feedback";
            };
            Pipeline pipe(w, stage, transport, kHidden, shape.max_item_tokens());
            pipe.set_busy_timer(&timer);
            pipe.run(job.schedule(), job.memory());
            if (r == P - 1) {
              GenerateResult result;
              job.take_results(&result);
              for (int64_t m = 0; m < M; ++m) got.push_back(float(result.generated[size_t(m * steps + steps - 1)]));
            }
          } catch (const std::exception& e) {
            errors[size_t(r)] = e.what();
          }
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < P; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
      EXPECT_EQ(got, want) << P << " stages, " << M << " microbatches";
    }
  }
}

TEST(PipelineSchedule, AWaitForASilentPeerTimesOut) {
  Hub hub;
  WorldConfig w;
  w.rank = 1;
  w.size = 2;
  FakeStage stage(3, 6, false, true);
  LoopbackTransport transport(hub, 1, 0.2);
  const PipelineShape shape{4, 2, 2, kHidden, kVocab, true, false, {}};
  Pipeline pipe(w, stage, transport, kHidden, shape.max_micro_tokens());
  ScoreJob job(w, stage, shape);
  try {
    pipe.run(job.schedule(), job.memory());
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out waiting for microbatch 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lfm2
