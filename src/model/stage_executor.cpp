// The generation methods' defaults: a backend that has not implemented them says so (copy_tokens:
// host memory's).
#include "model/stage_executor.h"

#include <cstring>

#include "common/error.h"

namespace lfm2 {
namespace {

[[noreturn]] void no_generation() { LFM2_FAIL("this backend does not generate yet (use --device cpu)"); }
[[noreturn]] void no_batches() { LFM2_FAIL("this backend does not run generation in batches yet"); }

}  // namespace

int64_t StageExecutor::state_bytes(int64_t, int64_t) const { no_generation(); }
void StageExecutor::alloc_state(int64_t, int64_t, const int32_t*, const SamplingParams&) { no_generation(); }
void StageExecutor::prefill(void*, int64_t, int64_t, int64_t) { no_generation(); }
void StageExecutor::decode(void*, int64_t, int64_t, int64_t) { no_generation(); }
int32_t* StageExecutor::alloc_tokens(int64_t) { no_generation(); }
void StageExecutor::embed_tokens(const int32_t*, int64_t, void*) { no_generation(); }
void StageExecutor::choose(const void*, int64_t, int64_t, int64_t, int64_t, int32_t*, int32_t*) { no_generation(); }
int64_t StageExecutor::page_bytes(int64_t) const { no_batches(); }
int64_t StageExecutor::slot_bytes() const { no_batches(); }
void StageExecutor::alloc_batch_state(const StateShape&, const SamplingParams&) { no_batches(); }
void StageExecutor::map_pages(int64_t, int64_t, const int32_t*, int64_t) { no_batches(); }
void StageExecutor::embed_batch(const StepBatch&, const int32_t*, const int32_t*, void*) { no_batches(); }
void StageExecutor::copy_tokens(int32_t* dst, const int32_t* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, size_t(n) * sizeof(int32_t));
}
void StageExecutor::forward_batch(void*, const StepBatch&) { no_batches(); }
void StageExecutor::choose_batch(const void*, const StepBatch&, const SeqSampling*, int32_t*, int32_t*) {
  no_batches();
}

}  // namespace lfm2
