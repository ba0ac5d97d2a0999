// The MoE permutation's block-level pieces (moe_permute.cu), shared with the fused decode router
// (moe_router.cu, which runs the whole permutation in its last block): a chunk's ranks per expert,
// and the one-block permutation. Blocks of kChunk threads.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace lfm2::cuda::permute {

constexpr int kChunk = 256;  // pairs per round = threads per block
constexpr int kWarps = kChunk / 32;

// Rank of this thread's pair among the chunk's earlier pairs of the same expert, and (in wcount)
// each warp's count per expert. e < 0 marks a pair past the end or a dropped one.
template <int kMaxE>
__device__ __forceinline__ int chunk_rank(int e, int (*wcount)[kMaxE], int n_experts) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kWarps * n_experts; i += kChunk) wcount[i / n_experts][i % n_experts] = 0;
  __syncthreads();
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int lane_rank = __popc(peers & ((1u << lane) - 1u));
  if (e >= 0 && lane_rank == 0) wcount[warp][e] = __popc(peers);
  __syncthreads();
  int r = lane_rank;
  if (e >= 0)
    for (int w = 0; w < warp; ++w) r += wcount[w][e];
  return r;
}

// The permutation in one block (decode: a few hundred pairs): counts by shared atomics, one per
// (warp, expert) (an order-free sum), a warp scan of the counts, then the pairs in rounds of kChunk
// in pair order, each placed at its expert's running base + its rank in the round (chunk_rank).
// Same outputs as moe_permute's three launches. `experts` is read through L2 (__ldcg): the fused
// router's last block reads what the other blocks of its grid wrote. wcount, base: shared memory.
template <int kMaxE>
__device__ __forceinline__ void permute_block(int32_t* offsets, int32_t* src_token, int32_t* dest_row,
                                              const int32_t* experts, int n_pairs, int n_experts, int top_k,
                                              int (*wcount)[kMaxE], int* base) {
  __shared__ int total;
  for (int x = threadIdx.x; x < n_experts; x += kChunk) base[x] = 0;
  __syncthreads();
  for (int r0 = 0; r0 < n_pairs; r0 += kChunk) {  // one shared atomic per (warp, expert)
    const int i = r0 + int(threadIdx.x);
    const int e = i < n_pairs ? __ldcg(experts + i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && (peers & ((1u << (threadIdx.x & 31)) - 1u)) == 0) atomicAdd(&base[e], __popc(peers));
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // exclusive scan, 32 experts at a time
    const int lane = threadIdx.x;
    int run = 0;
    for (int b = 0; b < n_experts; b += 32) {
      const int x = b + lane;
      const int v = x < n_experts ? base[x] : 0;
      int incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
      }
      if (x < n_experts) {
        base[x] = run + incl - v;
        offsets[x] = run + incl - v;
      }
      run += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      offsets[n_experts] = run;
      total = run;
    }
  }
  __syncthreads();
  for (int r0 = 0; r0 < n_pairs; r0 += kChunk) {
    const int i = r0 + int(threadIdx.x);
    const int e = i < n_pairs ? __ldcg(experts + i) : -1;
    const int r = chunk_rank<kMaxE>(e, wcount, n_experts);
    if (i < n_pairs) {
      if (e < 0) {
        dest_row[i] = -1;
      } else {
        const int row = base[e] + r;
        src_token[row] = i / top_k;
        dest_row[i] = row;
      }
    }
    __syncthreads();  // every base[] read before the round's counts move it
    for (int x = threadIdx.x; x < n_experts; x += kChunk) {
      int c = 0;
      for (int w = 0; w < kWarps; ++w) c += wcount[w][x];
      base[x] += c;
    }
    __syncthreads();
  }
  for (int i = total + int(threadIdx.x); i < n_pairs; i += kChunk) src_token[i] = 0;
}

}  // namespace lfm2::cuda::permute
