// Permutation of the MoE (token, slot) pairs by expert, on the device, stable and deterministic,
// in three fully parallel launches (no host round trip, no atomics whose order matters):
//   1. count: each chunk of kChunk pairs counts its pairs per expert (warp __match_any_sync)
//   2. scan: exclusive scan of the counts in (expert, chunk) order, giving every chunk's first row
//      in every expert's group, and the group offsets
//   3. scatter: each pair's row = its chunk's base for its expert + its rank among the chunk's
//      earlier pairs of that expert (recomputed as in 1).
// Rows of one expert are therefore in (token, slot) order.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/moe_permute_block.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

using permute::kChunk;
using permute::kWarps;
constexpr int kMaxExperts = 1024;
constexpr int kScanThreads = 1024;

__device__ __forceinline__ int chunk_rank(int e, int (*wcount)[kMaxExperts], int n_experts) {
  return permute::chunk_rank<kMaxExperts>(e, wcount, n_experts);
}

__global__ void __launch_bounds__(kChunk) count_kernel(int32_t* chunk_counts, const int32_t* experts,
                                                       int64_t n_pairs, int n_experts, int64_t n_chunks) {
  __shared__ int wcount[kWarps][kMaxExperts];
  const int64_t i = blockIdx.x * int64_t(kChunk) + threadIdx.x;
  const int e = i < n_pairs ? experts[i] : -1;
  chunk_rank(e, wcount, n_experts);
  for (int x = threadIdx.x; x < n_experts; x += kChunk) {
    int c = 0;
    for (int w = 0; w < kWarps; ++w) c += wcount[w][x];
    chunk_counts[int64_t(x) * n_chunks + blockIdx.x] = c;
  }
}

// One block: exclusive scan of data (n) in place; offsets[e] = data[e * n_chunks] (after the scan),
// offsets[n_experts] = total.
__global__ void __launch_bounds__(kScanThreads) scan_kernel(int32_t* data, int64_t n, int32_t* offsets, int n_experts,
                                                            int64_t n_chunks) {
  __shared__ int sums[kScanThreads];
  const int t = threadIdx.x;
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t b = min(n, t * per), e = min(n, b + per);
  int s = 0;
  for (int64_t j = b; j < e; ++j) s += data[j];
  sums[t] = s;
  __syncthreads();
  for (int o = 1; o < kScanThreads; o <<= 1) {  // inclusive Hillis-Steele scan
    const int v = t >= o ? sums[t - o] : 0;
    __syncthreads();
    sums[t] += v;
    __syncthreads();
  }
  int run = sums[t] - s;  // exclusive
  for (int64_t j = b; j < e; ++j) {
    const int v = data[j];
    data[j] = run;
    run += v;
  }
  __syncthreads();  // makes this block's global writes visible to its other threads
  for (int x = t; x <= n_experts; x += kScanThreads)
    offsets[x] = x < n_experts ? data[int64_t(x) * n_chunks] : sums[kScanThreads - 1];
}

// Dropped pairs (expert -1) get dest_row -1; rows [total, n_pairs), which no pair fills when some
// were dropped, get src_token 0 so that a gather over all n_pairs rows reads inside its input.
__global__ void __launch_bounds__(kChunk) scatter_kernel(int32_t* src_token, int32_t* dest_row,
                                                         const int32_t* chunk_base, const int32_t* offsets,
                                                         const int32_t* experts, int64_t n_pairs, int n_experts,
                                                         int64_t n_chunks, int top_k) {
  __shared__ int wcount[kWarps][kMaxExperts];
  const int64_t i = blockIdx.x * int64_t(kChunk) + threadIdx.x;
  const int e = i < n_pairs ? experts[i] : -1;
  const int r = chunk_rank(e, wcount, n_experts);
  if (i >= n_pairs) return;
  if (i >= offsets[n_experts]) src_token[i] = 0;
  if (e < 0) {
    dest_row[i] = -1;
    return;
  }
  const int row = chunk_base[int64_t(e) * n_chunks + blockIdx.x] + r;
  src_token[row] = int32_t(i / top_k);
  dest_row[i] = row;
}

// The same permutation in one block (decode: a few hundred pairs, where three launches cost more
// than the work): permute::permute_block. Same outputs as the three launches, bit for bit.
__global__ void __launch_bounds__(kChunk) permute_one_block_kernel(int32_t* offsets, int32_t* src_token,
                                                                   int32_t* dest_row, const int32_t* experts,
                                                                   int n_pairs, int n_experts, int top_k) {
  __shared__ int wcount[kWarps][kMaxExperts];
  __shared__ int base[kMaxExperts];  // counts, then each expert's next free row
  permute::permute_block<kMaxExperts>(offsets, src_token, dest_row, experts, n_pairs, n_experts, top_k, wcount, base);
}

}  // namespace

int64_t moe_permute_scratch_ints(int64_t n_tokens, int64_t n_experts, int64_t top_k) {
  return n_experts * ((n_tokens * top_k + kChunk - 1) / kChunk);
}

void moe_permute(int32_t* offsets, int32_t* src_token, int32_t* dest_row, const int32_t* experts, int64_t n_tokens,
                 int64_t n_experts, int64_t top_k, int32_t* scratch, cudaStream_t stream) {
  LFM2_CHECK(n_experts >= 1 && n_experts <= kMaxExperts, "moe_permute: ", n_experts, " experts (at most ",
             kMaxExperts, ")");
  const int64_t n_pairs = n_tokens * top_k;
  LFM2_CHECK(n_pairs < (int64_t(1) << 31), "moe_permute: ", n_pairs, " pairs");
  const int64_t n_chunks = (n_pairs + kChunk - 1) / kChunk;
  if (n_chunks == 0) {
    CUDA_CHECK(cudaMemsetAsync(offsets, 0, size_t(n_experts + 1) * sizeof(int32_t), stream));
    return;
  }
  count_kernel<<<unsigned(n_chunks), kChunk, 0, stream>>>(scratch, experts, n_pairs, int(n_experts), n_chunks);
  CUDA_CHECK_LAUNCH("moe_permute count_kernel");
  scan_kernel<<<1, kScanThreads, 0, stream>>>(scratch, n_experts * n_chunks, offsets, int(n_experts), n_chunks);
  CUDA_CHECK_LAUNCH("moe_permute scan_kernel");
  scatter_kernel<<<unsigned(n_chunks), kChunk, 0, stream>>>(src_token, dest_row, scratch, offsets, experts,
                                                            n_pairs, int(n_experts), n_chunks, int(top_k));
  CUDA_CHECK_LAUNCH("moe_permute scatter_kernel");
}

void moe_permute_one_block(int32_t* offsets, int32_t* src_token, int32_t* dest_row, const int32_t* experts,
                           int64_t n_tokens, int64_t n_experts, int64_t top_k, cudaStream_t stream) {
  LFM2_CHECK(n_experts >= 1 && n_experts <= kMaxExperts, "moe_permute_one_block: ", n_experts, " experts (at most ",
             kMaxExperts, ")");
  const int64_t n_pairs = n_tokens * top_k;
  LFM2_CHECK(n_pairs < (int64_t(1) << 31), "moe_permute_one_block: ", n_pairs, " pairs");
  permute_one_block_kernel<<<1, kChunk, 0, stream>>>(offsets, src_token, dest_row, experts, int(n_pairs),
                                                      int(n_experts), int(top_k));
  CUDA_CHECK_LAUNCH("moe_permute permute_one_block_kernel");
}

}  // namespace lfm2::cuda
