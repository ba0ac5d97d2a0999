// The warp-level core of the decode products (few rows, weights streamed once): one warp computes
// a tile of 16 * MT weight rows x 8 * NT tokens with mma.sync.m16n8k16 (bf16 / fp16 in, fp32
// accumulate), "swap-AB": the weight is the large A operand (rows = output features), the tokens
// are the small B operand, so a handful of tokens still fills the tensor core's M side.
//
// Each lane loads its weight fragments straight from global memory with 16-byte loads (the
// activations come from shared memory, block_gemm below). The k order inside a 64-wide block is
// permuted so that those loads are contiguous: in the block
// at kb, lane (g = lane / 4, q = lane % 4) holds, for each of its rows, the 16 elements
// [kb + 8q, kb + 8q + 8) and [kb + 32 + 8q, kb + 32 + 8q + 8) as 8 words; mma step s (0..3) uses
// words 2s and 2s + 1, which the instruction reads as its k columns {2q, 2q + 1} and
// {2q + 8, 2q + 9}. A token's lane (the B operand) holds the same k elements of the token's row in
// the same words, so every step multiplies matching k; over the 4 steps the 64 k of the block are
// each taken once. (The four lanes of a row read 64 contiguous bytes per load, two full sectors.)
//
// The arithmetic of an output element (row r, token n) is therefore fixed by the shape alone:
// 64-k blocks in ascending order, in each the 4 steps in order, each step one mma adding a 16-term
// group into the fp32 accumulator. It does not depend on which tile, slot or warp holds the token,
// on the other tokens (the tensor core computes each (row, column) from that row and column only)
// or on how many tokens the call has: the decode kernels' rows are bit-identical for any batch.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace lfm2::cuda::gemv {

constexpr int kBlockK = 64;  // k per iteration of a warp: 4 mma steps of 16

// A lane's 16 k-values of one row (or one token) in a 64-k block, as 8 words of two elements.
struct Frag {
  uint4 lo, hi;  // elements [kb + 8q, +8) and [kb + 32 + 8q, +8)
};

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// A 16-byte load when `pred`, else zeros, without a branch (a predicated load: the lanes of a warp
// differ in which rows and k they hold). Weights are read once per call, so they do not allocate
// in L1 (kind 0) unless several warps of the block read the same rows (kind 1); activations are
// reused by the block's warps (kind 1).
template <int kL1>
__device__ __forceinline__ uint4 load16(const void* p, bool pred) {
  uint4 r = zero4();
  if constexpr (kL1 == 0)
    asm(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
        : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
        : "l"(p), "r"(int(pred)));
  else
    asm(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " @p ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
        : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
        : "l"(p), "r"(int(pred)));
  return r;
}

// The lane's fragment of `row` (nullptr: zeros) in the block at kb; elements at or past k_end read
// as zeros (k_end and kb multiples of 8, so each 8-element load is wholly in or out).
template <typename T, int kL1>
__device__ __forceinline__ Frag load_frag(const T* row, int64_t kb, int64_t k_end, int q) {
  const int64_t k0 = kb + 8 * q, k1 = k0 + 32;
  const bool live = row != nullptr;
  Frag f;
  f.lo = load16<kL1>(row + (live ? k0 : 0), live && k0 < k_end);
  f.hi = load16<kL1>(row + (live ? k1 : 0), live && k1 < k_end);
  return f;
}

// Word 2s (first) and 2s + 1 (second) of a fragment, s = 0..3.
template <int S>
__device__ __forceinline__ uint32_t word_a(const Frag& f) {
  return S == 0 ? f.lo.x : S == 1 ? f.lo.z : S == 2 ? f.hi.x : f.hi.z;
}
template <int S>
__device__ __forceinline__ uint32_t word_b(const Frag& f) {
  return S == 0 ? f.lo.y : S == 1 ? f.lo.w : S == 2 ? f.hi.y : f.hi.w;
}

// d += A (16 x 16, row) * B (16 x 8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One mma step s of the block into n-tile t: a[m][0] / a[m][1] are rows g and g + 8 of m-tile m.
template <typename T, int MT, int NT, int S>
__device__ __forceinline__ void step(float (&acc)[MT][NT][4], int t, const Frag (&a)[MT][2], const Frag& b) {
  const uint32_t b0 = word_a<S>(b), b1 = word_b<S>(b);
#pragma unroll
  for (int m = 0; m < MT; ++m)
    mma16816<T>(acc[m][t], word_a<S>(a[m][0]), word_a<S>(a[m][1]), word_b<S>(a[m][0]), word_b<S>(a[m][1]), b0, b1);
}

// ---- the block loop: activations staged in shared memory, weights streamed into registers.
//
// The block's TB token rows are copied chunk by chunk (kChunkK k at a time, cp.async, double
// buffered: chunk c + 1 lands while chunk c is multiplied) into rows of kStageRow elements; the
// 32-element pad keeps the lanes' 16-byte reads of a fragment conflict-free (rows 576 bytes apart
// for 16-bit T: lanes g and g + 1 fall in opposite halves of the banks). Each warp streams its own
// weight rows from global memory, the next 64-k block in flight while the current one is
// multiplied. Reading the activations from shared memory keeps a warp's loop waiting on one weight
// load per block instead of one activation load per token tile.
constexpr int kChunkK = 256;
constexpr int kStageRow = kChunkK + 32;

template <typename T>
constexpr int stage_bytes(int tb) {
  return 2 * tb * kStageRow * int(sizeof(T)) + tb * int(sizeof(void*));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool live) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(live ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// Copies k in [kc, kc + kChunkK) of the TB rows (rows[r]: nullptr for none; k at or past k_end: zeros)
// into dst (TB, kStageRow). `any` is a valid global address, the source of zero-filled copies.
template <typename T, int TB>
__device__ __forceinline__ void stage_chunk(T* dst, const T* const* rows, const T* any, int64_t kc, int64_t k_end) {
  constexpr int kVecs = kChunkK / 8;
  for (int i = threadIdx.x; i < TB * kVecs; i += blockDim.x) {
    const int r = i / kVecs, v = i - r * kVecs;
    const int64_t k = kc + 8 * v;
    const T* src = rows[r];
    const bool live = src != nullptr && k < k_end;
    cp_async16(dst + r * kStageRow + 8 * v, live ? src + k : any, live);
  }
}

// acc[m][t] += W[rows of m-tile m] . X[tokens of n-tile t] over k in [k0, k_end) (k0 a multiple of
// kBlockK), for every warp of the block. Called by all threads of the block (it synchronises).
// w[m][0] / w[m][1]: this lane's rows g and g + 8 of m-tile m (nullptr: past the end); `live`: the
// warp has rows (else it only helps staging); its n-tile t holds the staged tokens tok0 + 8 t + [0, 8)
// and only t < nt is computed. s_rows: the block's TB token row pointers in shared memory (ready);
// s_x: 2 * TB * kStageRow elements of shared memory; any: a valid global address.
template <typename T, int MT, int NT, int TB, bool kSharedW>
__device__ __forceinline__ void block_gemm(float (&acc)[MT][NT][4], const T* const (&w)[MT][2], bool live, int tok0,
                                           int nt, const T* const* s_rows, T* s_x, const T* any, int64_t k0,
                                           int64_t k_end) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  if (k0 >= k_end) return;
  const int n_chunks = int((k_end - k0 + kChunkK - 1) / kChunkK);
  Frag cur[MT][2];
  if (live) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) cur[m][r] = load_frag<T, kSharedW ? 1 : 0>(w[m][r], k0, k_end, q);
  }
  stage_chunk<T, TB>(s_x, s_rows, any, k0, k_end);
  cp_async_commit();
  for (int c = 0; c < n_chunks; ++c) {
    const int64_t kc = k0 + int64_t(c) * kChunkK, kc_end = min(k_end, kc + kChunkK);
    if (c + 1 < n_chunks) stage_chunk<T, TB>(s_x + ((c + 1) & 1) * TB * kStageRow, s_rows, any, kc + kChunkK, k_end);
    cp_async_commit();  // (empty on the last chunk: wait_group 1 then still means "chunk c landed")
    cp_async_wait_one();
    __syncthreads();
    const T* xb = s_x + (c & 1) * TB * kStageRow;
    if (live) {
      for (int64_t kb = kc; kb < kc_end; kb += kBlockK) {
        const bool more = kb + kBlockK < k_end;
        Frag nxt[MT][2];
        if (more) {
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int r = 0; r < 2; ++r) nxt[m][r] = load_frag<T, kSharedW ? 1 : 0>(w[m][r], kb + kBlockK, k_end, q);
        }
        const T* xk = xb + (kb - kc) + 8 * q;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            const T* xr = xk + (tok0 + 8 * t + g) * kStageRow;
            Frag b;
            b.lo = *reinterpret_cast<const uint4*>(xr);
            b.hi = *reinterpret_cast<const uint4*>(xr + 32);
            step<T, MT, NT, 0>(acc, t, cur, b);
            step<T, MT, NT, 1>(acc, t, cur, b);
            step<T, MT, NT, 2>(acc, t, cur, b);
            step<T, MT, NT, 3>(acc, t, cur, b);
          }
        }
        if (more) {
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int r = 0; r < 2; ++r) cur[m][r] = nxt[m][r];
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before chunk c + 2 is staged into it
  }
}

// The accumulator element c (0..3) of a lane: weight row g + 8 (c / 2) of its m-tile, token
// 2q + (c % 2) of its n-tile (the m16n8 C layout).
__device__ __forceinline__ int acc_row(int lane, int c) { return (lane >> 2) + 8 * (c >> 1); }
__device__ __forceinline__ int acc_col(int lane, int c) { return 2 * (lane & 3) + (c & 1); }

}  // namespace lfm2::cuda::gemv
