// moe_permute's grouping padded per expert (grouped_gemm_fp8.h: moe_pad_rows), for the padded FP8
// product: one launch, each block computing the padded offsets of the (few) experts in shared
// memory again, then a thread per padded row (its token), per pair (its padded row) and per tile
// (its expert); thread 0 writes the one group and the rows in use. Bits of cpu::moe_pad_rows.
#include <algorithm>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/moe_rows.cuh"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxExperts = 1024;

__global__ void __launch_bounds__(kThreads)
    pad_rows_kernel(int32_t* src_pad, int32_t* dest_pad, int32_t* tile_expert, int32_t* one_group,
                    int32_t* used_rows, const int32_t* offsets, const int32_t* src_token, const int32_t* dest_row,
                    int64_t n_pairs, int n_experts, int64_t m_pad) {
  __shared__ int32_t off[kMaxExperts + 1], poff[kMaxExperts + 1];
  for (int e = threadIdx.x; e <= n_experts; e += kThreads) off[e] = offsets[e];
  __syncthreads();
  if (threadIdx.x == 0) {  // a serial scan: n_experts is a few dozen
    poff[0] = 0;
    for (int e = 0; e < n_experts; ++e) poff[e + 1] = poff[e] + (off[e + 1] - off[e] + 127) / 128 * 128;
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i == 0) {
    one_group[0] = 0;
    one_group[1] = int32_t(m_pad);
    *used_rows = poff[n_experts];
  }
  if (i < m_pad) {
    int32_t src = -1;
    if (i < poff[n_experts]) {
      int64_t p0 = 0, m = 0;
      const int e = row_expert(i, poff, n_experts, p0, m);  // the padded block holding row i
      const int64_t local = i - p0;
      if (local < off[e + 1] - off[e]) src = src_token[off[e] + local];
    }
    src_pad[i] = src;
  }
  if (i < n_pairs) {
    const int32_t d = dest_row[i];
    int32_t p = -1;
    if (d >= 0) {
      int64_t r0 = 0, m = 0;
      const int e = row_expert(d, off, n_experts, r0, m);
      p = int32_t(d - r0 + poff[e]);
    }
    dest_pad[i] = p;
  }
  if (i < m_pad / 128) {
    const int64_t row = i * 128;
    int64_t p0 = 0, m = 0;
    tile_expert[i] = row < poff[n_experts] ? row_expert(row, poff, n_experts, p0, m) : n_experts - 1;
  }
}

}  // namespace

void moe_pad_rows(int32_t* src_pad, int32_t* dest_pad, int32_t* tile_expert, int32_t* one_group, int32_t* used_rows,
                  const int32_t* offsets, const int32_t* src_token, const int32_t* dest_row, int64_t n_pairs,
                  int64_t n_experts, int64_t m_pad, cudaStream_t stream) {
  LFM2_CHECK(n_experts >= 1 && n_experts <= kMaxExperts, "moe_pad_rows: ", n_experts, " experts (at most ",
             kMaxExperts, ")");
  LFM2_CHECK(m_pad % 128 == 0 && m_pad >= moe_padded_rows(n_pairs, n_experts) && m_pad < (int64_t(1) << 31),
             "moe_pad_rows: ", m_pad, " padded rows for ", n_pairs, " pairs and ", n_experts,
             " experts (a multiple of 128, at least moe_padded_rows)");
  const int64_t n = std::max(m_pad, n_pairs);
  if (n == 0) return;
  pad_rows_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      src_pad, dest_pad, tile_expert, one_group, used_rows, offsets, src_token, dest_row, n_pairs, int(n_experts),
      m_pad);
  CUDA_CHECK_LAUNCH("moe_pad_rows pad_rows_kernel");
}

}  // namespace lfm2::cuda
