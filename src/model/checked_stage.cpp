#include "model/checked_stage.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "kernels/nonfinite.h"

namespace lfm2 {
namespace {

class CheckedStage final : public StageExecutor {
 public:
  CheckedStage(StageExecutor& inner, const StageLayers& stage, const CheckShape& shape, int n_threads, bool allow)
      : inner_(inner), stage_(stage), n_micro_(std::max<int64_t>(1, shape.n_micro)), microbatch_(shape.microbatch),
        hidden_(shape.hidden), vocab_(shape.vocab), first_seq_(shape.first_seq), n_threads_(n_threads), allow_(allow) {
    if (inner_.on_device())
      counts_ = static_cast<uint32_t*>(inner_.alloc_host(2 * n_micro_ * int64_t(sizeof(uint32_t))));
  }

  DType act_dtype() const override { return inner_.act_dtype(); }
  bool on_device() const override { return inner_.on_device(); }
  int64_t weight_bytes() const override { return inner_.weight_bytes(); }
  void* alloc_hidden(int64_t max_tokens) override { return inner_.alloc_hidden(max_tokens); }
  void* alloc_host(int64_t bytes) override { return inner_.alloc_host(bytes); }
  bool count_nonfinite(const void* buf, int64_t n, uint32_t* count) override {
    return inner_.count_nonfinite(buf, n, count);
  }

  void embed(const int32_t* ids, int64_t n_seq, int64_t seq_len, void* x) override {
    const int64_t m = embeds_++ % n_micro_;
    inner_.embed(ids, n_seq, seq_len, x);
    check_hidden(x, n_seq, seq_len, m, 0, "after the embedding");
  }

  void forward(void* x, int64_t n_seq, int64_t seq_len) override {
    const int64_t m = forwards_++ % n_micro_;
    inner_.forward(x, n_seq, seq_len);
    check_hidden(x, n_seq, seq_len, m, 1, cat("after layers ", stage_.layer_begin, "-", stage_.layer_end - 1));
  }

  void head(const void* x, int64_t n_seq, int64_t seq_len, const int32_t* lengths, const HeadOutputs& out) override {
    const int64_t m = heads_++ % n_micro_;
    HeadOutputs o = out;
    // The host head computes the logits anyway: into a buffer of ours, so that they are checked.
    if (!on_device() && !o.logits) o.logits = grow(logits_, n_seq * vocab_);
    inner_.head(x, n_seq, seq_len, lengths, o);
    if (on_device()) {
      heads_pending_.push_back({m, n_seq, seq_len, o});
      return;
    }
    check_head(m, n_seq, seq_len, o);
  }

  // Generation: the same checks on the hidden states of each prefill and decode step (the
  // microbatch is named from its first sequence). Device executors count into one slot per
  // microbatch and step, read at the next synchronize().
  int64_t state_bytes(int64_t n_seq, int64_t max_len) const override { return inner_.state_bytes(n_seq, max_len); }
  void alloc_state(int64_t n_seq, int64_t max_len, const int32_t* lengths, const SamplingParams& s) override {
    inner_.alloc_state(n_seq, max_len, lengths, s);
    if (on_device() && max_len > max_steps_) {
      gen_counts_ = static_cast<uint32_t*>(inner_.alloc_host(n_micro_ * max_len * int64_t(sizeof(uint32_t))));
      max_steps_ = max_len;
    }
  }
  void prefill(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len) override {
    inner_.prefill(x, first_seq, n_seq, seq_len);
    check_step(x, first_seq, n_seq, seq_len, 0, " (prefill)");
  }
  void decode(void* x, int64_t first_seq, int64_t n_seq, int64_t step) override {
    inner_.decode(x, first_seq, n_seq, step);
    check_step(x, first_seq, n_seq, 1, step, cat(" (decode step ", step, ")"));
  }
  int32_t* alloc_tokens(int64_t n) override { return inner_.alloc_tokens(n); }
  void embed_tokens(const int32_t* tokens, int64_t n_seq, void* x) override { inner_.embed_tokens(tokens, n_seq, x); }
  void choose(const void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, int32_t* tokens,
              int32_t* host) override {
    inner_.choose(x, first_seq, n_seq, seq_len, step, tokens, host);
  }

  // Generation in batches: forwarded; the hidden states after each step checked as above (the
  // message names the step by its count).
  int64_t page_bytes(int64_t page_size) const override { return inner_.page_bytes(page_size); }
  int64_t slot_bytes() const override { return inner_.slot_bytes(); }
  void alloc_batch_state(const StateShape& shape, const SamplingParams& s) override {
    inner_.alloc_batch_state(shape, s);
    if (on_device() && !batch_counts_)
      batch_counts_ = static_cast<uint32_t*>(inner_.alloc_host(kBatchCounts * int64_t(sizeof(uint32_t))));
  }
  void map_pages(int64_t slot, int64_t first, const int32_t* pages, int64_t n) override {
    inner_.map_pages(slot, first, pages, n);
  }
  void embed_batch(const StepBatch& b, const int32_t* prompt_ids, const int32_t* fed, void* x) override {
    inner_.embed_batch(b, prompt_ids, fed, x);
  }
  void forward_batch(void* x, const StepBatch& b) override {
    inner_.forward_batch(x, b);
    const int64_t step = batch_steps_++;
    const std::string where = cat("after layers ", stage_.layer_begin, "-", stage_.layer_end - 1,
                                  " (generation step ", step, ")");
    if (!on_device()) return check_hidden(x, 1, b.rows(), 0, 1, where);
    if (pending_.size() >= size_t(kBatchCounts)) synchronize();  // every counter is waiting to be read
    check_hidden(x, 1, b.rows(), 0, 1, where, batch_counts_ + step % kBatchCounts);
  }
  void copy_tokens(int32_t* dst, const int32_t* src, int64_t n) override { inner_.copy_tokens(dst, src, n); }
  void choose_batch(const void* x, const StepBatch& b, const SeqSampling* params, int32_t* tokens,
                    int32_t* host) override {
    inner_.choose_batch(x, b, params, tokens, host);
  }

  void synchronize() override {
    inner_.synchronize();
    if (!on_device()) return;
    // Device path: the counts and head outputs of this run, in the order they were made.
    std::vector<Pending> pending;
    pending.swap(pending_);
    std::vector<HeadPending> heads;
    heads.swap(heads_pending_);
    for (const Pending& p : pending)
      if (*p.count) found(*p.count, p.n_seq * p.seq_len, p.m, -1, p.seq_len, p.where, "hidden states");
    for (const HeadPending& h : heads) check_head(h.m, h.n_seq, h.seq_len, h.out);
  }

 private:
  struct Pending {
    uint32_t* count;
    int64_t m, n_seq, seq_len;
    std::string where;
  };
  struct HeadPending {
    int64_t m, n_seq, seq_len;
    HeadOutputs out;
  };

  void check_step(void* x, int64_t first_seq, int64_t n_seq, int64_t seq_len, int64_t step, const std::string& what) {
    const int64_t m = first_seq / microbatch_;
    const std::string where = cat("after layers ", stage_.layer_begin, "-", stage_.layer_end - 1, what);
    if (!on_device()) return check_hidden(x, n_seq, seq_len, m, 1, where);
    LFM2_CHECK(gen_counts_ && step < max_steps_, "checked stage: step ", step, " past the generation state");
    check_hidden(x, n_seq, seq_len, m, 1, where, gen_counts_ + m * max_steps_ + step);
  }

  // `slot`: the host count of a device check (default: one per microbatch and kind, for scoring).
  void check_hidden(void* x, int64_t n_seq, int64_t seq_len, int64_t m, int kind, const std::string& where,
                    uint32_t* slot = nullptr) {
    const int64_t n = n_seq * seq_len * hidden_;
    if (on_device()) {
      uint32_t* c = slot ? slot : counts_ + kind * n_micro_ + m;
      *c = 0;
      if (inner_.count_nonfinite(x, n, c)) pending_.push_back({c, m, n_seq, seq_len, where});
      return;
    }
    int64_t first = -1;
    const int64_t bad = cpu::count_nonfinite(static_cast<const float*>(x), n, &first, n_threads_);
    if (bad) found(bad, n_seq * seq_len, m, first / hidden_, seq_len, where, "hidden states");
  }

  void check_head(int64_t m, int64_t n_seq, int64_t seq_len, const HeadOutputs& o) {
    const std::string where = "from the head (final norm and LM head)";
    int64_t first = -1;
    if (o.logits) {
      const int64_t bad = cpu::count_nonfinite(o.logits, n_seq * vocab_, &first, n_threads_);
      if (bad) return found(bad, n_seq, m, first / vocab_ * seq_len + seq_len - 1, seq_len, where, "logits");
    }
    if (o.margin) {
      const int64_t bad = cpu::count_nonfinite(o.margin, n_seq, &first, 1);
      if (bad) return found(bad, n_seq, m, first * seq_len + seq_len - 1, seq_len, where, "top-1 margins");
    }
    if (o.all_logits) {
      const int64_t bad = cpu::count_nonfinite(o.all_logits, n_seq * seq_len * vocab_, &first, n_threads_);
      if (bad) return found(bad, n_seq * seq_len, m, first / vocab_, seq_len, where, "logits");
    }
  }

  // `bad` non-finite values among `rows` rows of microbatch m; `row` the first one's (token) row
  // within the microbatch, -1 if unknown.
  void found(int64_t bad, int64_t rows, int64_t m, int64_t row, int64_t seq_len, const std::string& where,
             const char* what) {
    const int64_t seq0 = first_seq_ + m * microbatch_;
    const int64_t n_seq = std::max<int64_t>(1, rows / std::max<int64_t>(1, seq_len));
    const std::string msg = cat(
        "NaN/Inf in the ", what, " ", where, ", microbatch ", m,
        n_seq == 1 ? cat(" (sequence ", seq0, ")") : cat(" (sequences ", seq0, "-", seq0 + n_seq - 1, ")"), ": ", bad,
        " non-finite value", bad == 1 ? "" : "s",
        row >= 0 ? cat(", the first at sequence ", seq0 + row / seq_len, " token ", row % seq_len) : std::string());
    if (!allow_)
      throw NonFiniteError(msg +
                           " (do the weights hold NaN/Inf? h5pack verify counts them; --allow-nonfinite runs on)");
    if (!warned_) log_info("warning: " + msg + " (--allow-nonfinite: going on)");
    warned_ = true;
  }

  static float* grow(std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }

 private:
  StageExecutor& inner_;
  StageLayers stage_;
  int64_t n_micro_, microbatch_, hidden_, vocab_, first_seq_;
  int n_threads_;
  bool allow_, warned_ = false;
  int64_t embeds_ = 0, forwards_ = 0, heads_ = 0;
  uint32_t* counts_ = nullptr;
  uint32_t* gen_counts_ = nullptr;  // generation on a device: (n_micro, max_steps)
  static constexpr int64_t kBatchCounts = 4096;
  uint32_t* batch_counts_ = nullptr;  // batch steps on a device: a ring of counts read at synchronize()
  int64_t batch_steps_ = 0;
  int64_t max_steps_ = 0;
  std::vector<Pending> pending_;
  std::vector<HeadPending> heads_pending_;
  std::vector<float> logits_;
};

}  // namespace

std::unique_ptr<StageExecutor> make_checked_stage(StageExecutor& inner, const StageLayers& stage,
                                                  const CheckShape& shape, int n_threads, bool allow_nonfinite) {
  return std::make_unique<CheckedStage>(inner, stage, shape, n_threads, allow_nonfinite);
}

}  // namespace lfm2
