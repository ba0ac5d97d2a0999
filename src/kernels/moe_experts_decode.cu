// The routed experts at decode sizes (a few rows per expert): x += experts(in), as moe_experts,
// reading each touched expert's weights once at close to the memory bandwidth. Four launches:
//   1. the permutation: moe_permute_one_block (moe_experts_decode), or the fused decode router
//      moe_route_decode (logits + top-k + drop + permutation, moe_decode)
//   2. gate/up + SwiGLU -> act (P, I), T          } cuda/moe_decode_gemm.cuh: persistent blocks over
//   3. down -> y (P, H), fp32                     } (touched expert, row tile) units, cp.async stages
//   4. moe_combine_rmsnorm: each token's k rows summed in ascending expert order into x (and, in
//      moe_decode, the next layer's RMSNorm of x)
// 2-4 are launched as programmatic dependents of the launch before them, so each one's start
// (and down's first weight stages) overlaps the previous one's tail; on an H200 2 and 3 are one
// grid (moe_decode_fused.cuh: down's units start once their expert's act rows are written).
// Dropped pairs (expert -1) get no row. Every element's arithmetic is fixed by the shapes, so a
// row's bits do not depend on the batch, the other rows or their routing. fp32 runs moe_experts
// (exact SIMT, per row as well).
//
// Measured (H100, bf16, one layer of LFM2-8B-A1B, cuda_bench_decode; copy floor of the touched
// experts at 3.01 TB/s): moe_decode (router, products, combine) 0.188 / 0.263 / 0.266 / 0.271 /
// 0.297 ms at 8 / 32 / 64 / 128 / 256 tokens; moe_experts_decode alone 0.176 / 0.251 / 0.255 /
// 0.257 / 0.284 (83 / 93 / 92 / 91 / 83 % of the floor); torch grouped_mm 0.215 / 0.292 / 0.293 /
// 0.287 / 0.290 in the same call. The default products are variant 2 (6 stages, one block per SM,
// L2 hints) below a mean of 32 rows per expert and variant 4 (two blocks per SM of 4 stages) from
// it: alone they are within 1-2 % of each other, but inside the step at 256 rows (the model's
// routing, some experts crowded) variant 4 took a layer's router-to-combine from 320 to 301 us, and
// at 32 rows variant 2 is 10 us a layer ahead (gemm_config). The hints are worth 4-6 % (variant 5);
// 8 stages (variant 3) changes nothing. On compute capability 9.0 the default is variant 11 (15 on
// an H200: gemm_config), the same pipeline with the stages multiplied by wgmma
// (moe_decode_wgmma.cuh) and the units taken from a counter: one H100, moe_experts_decode alone
// 0.2489 / 0.2620 ms at 32 / 256 tokens (94 / 90 % of the floor) against 0.2497 / 0.2658 with fixed
// shares (variant 9), which took 0.177 / 0.249 / 0.251 / 0.255 / 0.264 ms at 8 / 32 / 64 / 128 /
// 256 tokens against 0.176 / 0.253 / 0.256 / 0.259 / 0.286 for variants 2 / 4 (ninth session).
//
// Variant 1 (moe_experts_decode_force_variant, tuning only) runs the first decode kernels instead:
// gemv_mma.cuh's register-streamed warp tiles, grid (row tiles, E), NT tokens per pass: 0.167 /
// 0.252 / 0.258 / 0.291 / 0.414 ms; one 64-k block in flight per warp and a fixed grid of (row tiles
// x experts) blocks left 256 tokens at 57 % of the floor.
#include <algorithm>
#include <type_traits>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/env.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/moe_decode_gemm.cuh"
#include "kernels/cuda/moe_decode_wgmma.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// The scratch: the permutation, act, y; then (moe_decode) the router's weights and experts.
struct Layout {
  int64_t offsets, src_token, dest_row, act, y, weights, experts, total;  // byte offsets
};

Layout layout(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k, int64_t elem) {
  const int64_t P = n_tokens * top_k;
  Layout l;
  l.offsets = 0;
  l.src_token = l.offsets + align_up((n_experts + 1) * 4);
  l.dest_row = l.src_token + align_up(P * 4);
  l.act = l.dest_row + align_up(P * 4);
  l.y = l.act + align_up(P * inter * elem);
  l.weights = l.y + align_up(P * hidden * 4);
  l.experts = l.weights + align_up(P * 4);
  l.total = l.experts + align_up(P * 4);
  return l;
}

// The block's tokens of a pass: s_rows[i] = the row of slot p0 + i of expert e (nullptr past n_e).
template <typename T, int TB, typename RowOf>
__device__ __forceinline__ void set_rows(const T** s_rows, int p0, int n_e, RowOf row_of) {
  __syncthreads();  // the previous pass is done with them
  for (int i = threadIdx.x; i < TB; i += blockDim.x) s_rows[i] = p0 + i < n_e ? row_of(p0 + i) : nullptr;
  __syncthreads();
}

// gate/up + SwiGLU. Block (jt, e): warp w owns j in [64 jt + 16 w, +16): m-tile 0 the gate rows j,
// m-tile 1 the up rows I + j of w13_e (2I, H). The expert's tokens in passes of 8 NT.
template <typename T, int NT>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(T* act, const T* in, const T* w13, const int32_t* offsets,
                                                           const int32_t* src_token, int64_t H, int64_t I) {
  constexpr int TB = 8 * NT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_x = reinterpret_cast<T*>(smem);
  const T** s_rows = reinterpret_cast<const T**>(smem + 2 * TB * gemv::kStageRow * sizeof(T));
  const int e = blockIdx.y;
  const int begin = offsets[e], n_e = offsets[e + 1] - begin;
  if (n_e <= 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const int64_t j0 = (int64_t(blockIdx.x) * kWarps + warp) * 16;
  const T* we = w13 + int64_t(e) * 2 * I * H;
  const T* w[2][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = j0 + g + 8 * r;
    w[0][r] = j < I ? we + j * H : nullptr;
    w[1][r] = j < I ? we + (I + j) * H : nullptr;
  }
  for (int p0 = 0; p0 < n_e; p0 += TB) {
    const int nt = min(NT, (n_e - p0 + 7) / 8);
    set_rows<T, TB>(s_rows, p0, n_e, [&](int slot) { return in + int64_t(src_token[begin + slot]) * H; });
    float acc[2][NT][4] = {};
    gemv::block_gemm<T, 2, NT, TB, false>(acc, w, j0 < I, 0, nt, s_rows, s_x, in, 0, H);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + gemv::acc_row(lane, c);
        const int slot = p0 + 8 * t + gemv::acc_col(lane, c);
        if (j < I && slot < n_e) {
          const float gt = acc[0][t][c];
          act[int64_t(begin + slot) * I + j] = from_f32<T>(gt / (1.0f + expf(-gt)) * acc[1][t][c]);
        }
      }
    }
  }
}

// down. Block (ht, e): warp w owns h in [128 ht + 32 w, +32) (two m-tiles) of w2_e (H, I); the
// expert's act rows are contiguous from offsets[e]. y (P, H) fp32.
template <typename T, int NT>
__global__ void __launch_bounds__(kThreads) down_kernel(float* y, const T* act, const T* w2, const int32_t* offsets,
                                                        int64_t H, int64_t I) {
  constexpr int TB = 8 * NT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_x = reinterpret_cast<T*>(smem);
  const T** s_rows = reinterpret_cast<const T**>(smem + 2 * TB * gemv::kStageRow * sizeof(T));
  const int e = blockIdx.y;
  const int begin = offsets[e], n_e = offsets[e + 1] - begin;
  if (n_e <= 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const int64_t h0 = (int64_t(blockIdx.x) * kWarps + warp) * 32;
  const T* we = w2 + int64_t(e) * H * I;
  const T* w[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t h = h0 + 16 * m + g + 8 * r;
      w[m][r] = h < H ? we + h * I : nullptr;
    }
  for (int p0 = 0; p0 < n_e; p0 += TB) {
    const int nt = min(NT, (n_e - p0 + 7) / 8);
    set_rows<T, TB>(s_rows, p0, n_e, [&](int slot) { return act + int64_t(begin + slot) * I; });
    float acc[2][NT][4] = {};
    gemv::block_gemm<T, 2, NT, TB, false>(acc, w, h0 < H, 0, nt, s_rows, s_x, act, 0, I);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) continue;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t h = h0 + 16 * m + gemv::acc_row(lane, c);
          const int slot = p0 + 8 * t + gemv::acc_col(lane, c);
          if (h < H && slot < n_e) y[int64_t(begin + slot) * H + h] = acc[m][t][c];
        }
      }
  }
}

int g_force_nt = 0;  // moe_experts_decode_force_nt

// Tokens per pass (8 NT) from the mean rows per expert: at least twice the mean, so that most
// experts take one pass over their weights.
int pick_nt(int64_t n_tokens, int64_t n_experts, int64_t top_k) {
  if (g_force_nt > 0) return g_force_nt;
  const int64_t mean = (n_tokens * top_k + n_experts - 1) / n_experts;
  if (mean <= 2 || n_tokens <= 8) return 1;
  if (mean <= 8) return 2;
  if (mean <= 16) return 4;
  return 8;
}

template <typename T, int NT>
void launch_products(T* act, float* y, const T* in, const T* w13, const T* w2, const int32_t* offsets,
                     const int32_t* src_token, int64_t H, int64_t E, int64_t I, cudaStream_t stream) {
  constexpr int smem = gemv::stage_bytes<T>(8 * NT);
  raise_smem_limit(reinterpret_cast<const void*>(&gate_up_kernel<T, NT>), smem);
  raise_smem_limit(reinterpret_cast<const void*>(&down_kernel<T, NT>), smem);
  const dim3 g1(unsigned((I + 16 * kWarps - 1) / (16 * kWarps)), unsigned(E));
  gate_up_kernel<T, NT><<<g1, kThreads, smem, stream>>>(act, in, w13, offsets, src_token, H, I);
  CUDA_CHECK_LAUNCH("moe_experts_decode gate_up_kernel");
  const dim3 g2(unsigned((H + 32 * kWarps - 1) / (32 * kWarps)), unsigned(E));
  down_kernel<T, NT><<<g2, kThreads, smem, stream>>>(y, act, w2, offsets, H, I);
  CUDA_CHECK_LAUNCH("moe_experts_decode down_kernel");
}

// ---- the persistent pipelined products (moe_decode_gemm.cuh)

constexpr int kVariants = 15;  // the highest variant
int g_variant = -1;  // moe_experts_decode_force_variant; -1: LFM2_MOE_VARIANT (tuning), else 0

int variant() {
  static const int env = int(env_whole("LFM2_MOE_VARIANT", 0, 0, kVariants));
  return g_variant >= 0 ? g_variant : env;
}

// gate/up's likely first unit: the first bytes of its weight rows fetched into L2 while the router
// runs (moe_gemm::prefetch_first_unit; the units from a counter only). One H100, the step at 32 x
// 8192 / 256 x 64 (.bench/s13/call7.sh, alternated twice): 7.537 / 7.180 and 7.535 / 7.177 ms with
// 2048 bytes a row (34 MB over 132 blocks), 7.565 / 7.294 and 7.553 / 7.299 with none; 1024 bytes
// took 7.530 / 7.268 (call 6). batch 256 x (32 + 32): 29,150 against 28,804 tokens/s.
int g_spec_bytes = -1;  // moe_experts_decode_force_spec_bytes; -1: LFM2_MOE_SPEC_BYTES, else 2048
int spec_bytes() {
  static const int env = int(env_whole("LFM2_MOE_SPEC_BYTES", 2048, 0, 1 << 20));
  return g_spec_bytes >= 0 ? g_spec_bytes : env;
}

struct GemmConfig {
  int stages, ctas_per_sm, l2_hints, items = 0, wgmma = 0, taken = 0, fused = 0;  // fused 2: first units by block
};
// Variants 2..6: (stages, blocks per SM, L2 hints); 7, 8: 2 and 4 with blocks taking (unit, pass)
// items (moe_decode_gemm.cuh's item_of: for experts crowded past 64 rows). Not defaults: one H100,
// the step at 32 x 8192 / 256 x 64, 7.65 / 8.53 ms (7) and 7.77 / 8.06 (8) against the default's
// 7.58-7.62 / 8.02-8.03 in the same call (results.md, fifth session, call 6). 9, 10: 2 and 4 on
// wgmma (moe_decode_wgmma.cuh; compute capability 9.0 only, elsewhere they run 2). 11: 9 with
// the units taken from a counter as blocks free up (moe_gemm::UnitRing), 12: 11 with (unit, pass)
// items (elsewhere both on mma.sync). 13, 14: 11 with gate/up and down in one grid
// (moe_decode_fused.cuh), at one block of 6 stages an SM or two of 4 (elsewhere 11); 15: 14 with
// a block's first unit its own index (gate/up's prefetched one) rather than the counter's.
// 0, the default: variant 11 on compute capability 9.0, variant 15 where the DRAM peaks past 4.2
// TB/s (an H200: the same bits). One H200, the step at 32 x 8192 / 256 x 64, alternated twice in
// one call: 5.885 / 5.691 and 5.892 / 5.651 ms with 15, 5.937 / 5.759 and 5.933 / 5.675 with 14,
// 6.160 / 6.063 with 10 (.bench/s17/call4.sh); in an earlier call 14 5.907 / 5.650, 10 (the
// sixteenth session's default there) 6.113 / 5.982, 11 6.348 / 6.153, 13 6.870 / 6.908 (one block
// an SM: while it waits on ready[] its SM streams nothing; call2.sh). Before (.bench/s16/call3.sh):
// 10 6.186 / 6.035 against 11's 6.370 / 6.122; 4 at 32 rows, 6.104, has mma.sync's bits and loses
// at 256 (6.601). 14 and 15 were not measured on an H100 (nor the H100 NVL's ~3.9 TB/s), so 11
// stays the default there. One H100, the step at 32 x 8192 /
// 256 x 64 (.bench/s12/call3.sh, 11 and 9 twice): 7.614 / 7.342 and 7.595 / 7.344 ms with 11, 7.733
// / 7.532 and 7.726 / 7.528 with 9, 7.648 / 7.386 with 12: with fixed shares the blocks holding a
// crowded expert's units (two passes each) end last. Before it (.bench/wg/call2.sh): 7.69 / 7.60 ms
// with 9, 7.97 / 7.90 with 10, 7.76 / 8.47 with 2, 7.92 / 8.19 with 4 (the wgmma consumer keeps up
// with 32 rows per expert at one block of 6 stages per SM, where mma.sync needed two blocks).
// Elsewhere by the mean rows per expert: variant 4 (two blocks of 4 stages per SM) from 32 (256
// tokens at top-4 of 32), else 2 (a fifth-session H100: the step at 256 x 64 8.06 ms with 4, 8.33
// with 2; at 32 x 8192 8.01 with 4, 7.79 with 2, .bench/k3/run2.sh).
GemmConfig gemm_config(int64_t P, int64_t E, bool sm90, bool fast_dram) {
  switch (variant()) {
    case 2: return {6, 1, 1};
    case 3: return {8, 1, 1};
    case 4: return {4, 2, 1};
    case 5: return {6, 1, 0};
    case 6: return {4, 2, 0};
    case 7: return {6, 1, 1, 1};
    case 8: return {4, 2, 1, 1};
    case 9: return sm90 ? GemmConfig{6, 1, 1, 0, 1} : GemmConfig{6, 1, 1};  // elsewhere 2
    case 10: return sm90 ? GemmConfig{4, 2, 1, 0, 1} : GemmConfig{6, 1, 1};
    case 11: return sm90 ? GemmConfig{6, 1, 1, 0, 1, 1} : GemmConfig{6, 1, 1, 0, 0, 1};
    case 12: return sm90 ? GemmConfig{6, 1, 1, 1, 1, 1} : GemmConfig{6, 1, 1, 1, 0, 1};
    case 13: return sm90 ? GemmConfig{6, 1, 1, 0, 1, 1, 1} : GemmConfig{6, 1, 1, 0, 0, 1};
    case 14: return sm90 ? GemmConfig{4, 2, 1, 0, 1, 1, 1} : GemmConfig{6, 1, 1, 0, 0, 1};
    case 15: return sm90 ? GemmConfig{4, 2, 1, 0, 1, 1, 2} : GemmConfig{6, 1, 1, 0, 0, 1};
    default:
      if (sm90) return fast_dram ? GemmConfig{4, 2, 1, 0, 1, 1, 2} : GemmConfig{6, 1, 1, 0, 1, 1};
      return P >= 32 * E ? GemmConfig{4, 2, 1} : GemmConfig{6, 1, 1};
  }
}

template <typename T, bool kGateUp, int S>
void launch_gemm(const moe_gemm::Args& a, int64_t max_units, int ctas_per_sm, cudaStream_t stream) {
  launch_resident<moe_gemm::Args>(moe_gemm::moe_gemm_kernel<T, kGateUp, S>, a, moe_gemm::kThreads,
                                  moe_gemm::smem_bytes(S), max_units,
                                  ctas_per_sm, stream,
                                  kGateUp ? "moe_gemm_kernel (gate/up)" : "moe_gemm_kernel (down)");
}

// Variants 9 and 10 (6 stages at one block per SM, 4 at two): the wgmma consumer
// (moe_decode_wgmma.cuh), on compute capability 9.0 only (its kernels exist for sm_90a alone).
template <typename T>
void launch_wgmma(const moe_gemm::Args& a, bool gate_up, int64_t max_units, const GemmConfig& c, cudaStream_t stream) {
  launch_resident<moe_gemm::Args>(moe_gemm::wgmma_kernel<T>(gate_up, c.stages), a, moe_gemm::kThreads,
                                  moe_gemm::wgmma_smem_bytes(c.stages), max_units, c.ctas_per_sm, stream,
                                  gate_up ? "moe_gemm_kernel wgmma (gate/up)" : "moe_gemm_kernel wgmma (down)");
}

static_assert(kMoeReady >= moe_gemm::kMaxExperts, "the fused products' ready counts: one per expert");

// Variants 13-15: both products in one grid, the units of both from gate/up's counter pair. The grid
// is what the SMs hold at once (ctas_per_sm blocks an SM: 15's first units by block index need every
// block resident, moe_decode_fused.cuh; the kernels' shared memory and registers were sized for it).
template <typename T>
void launch_fused(const moe_gemm::Args& a, const moe_gemm::Args& b, int64_t max_units, const GemmConfig& c,
                  cudaStream_t stream) {
  const moe_gemm::FusedArgs f{a, b, decode_gemm_workspace().moe_ready, c.fused == 2};
  launch_resident<moe_gemm::FusedArgs>(moe_gemm::fused_kernel<T>(c.stages), f, moe_gemm::kThreads,
                                       moe_gemm::wgmma_smem_bytes(c.stages), max_units, c.ctas_per_sm, stream, "moe_fused_kernel (gate/up + down)");
}

template <typename T, int S>
void launch_pipelined(T* act, float* y, const T* in, const T* w13, const T* w2, const int32_t* offsets,
                      const int32_t* src_token, int64_t P, int64_t H, int64_t E, int64_t I, const GemmConfig& c,
                      cudaStream_t stream) {
  const int64_t touched = std::min(E, P);
  const int64_t units13 = touched * ((I + 63) / 64), units2 = touched * ((H + moe_gemm::kBM - 1) / moe_gemm::kBM);
  moe_gemm::Args a{w13, in, offsets, src_token, act, H, I, int(E), c.l2_hints, c.items};
  moe_gemm::Args b{w2, act, offsets, nullptr, y, I, H, int(E), c.l2_hints, c.items};
  if (c.taken) {  // the units from the device's two counter pairs (cublas_ctx.h), self-resetting
    int* ctr = decode_gemm_workspace().moe_unit_counters;
    a.ctr = ctr;
    b.ctr = ctr + 2;
    a.spec_bytes = spec_bytes();
  }
  if (c.fused) {
    launch_fused<T>(a, b, units13 + units2, c, stream);
    return;
  }
  if (c.wgmma) {
    launch_wgmma<T>(a, true, units13, c, stream);
    launch_wgmma<T>(b, false, units2, c, stream);
    return;
  }
  launch_gemm<T, true, S>(a, units13, c.ctas_per_sm, stream);
  launch_gemm<T, false, S>(b, units2, c.ctas_per_sm, stream);
}

// act and y from the permutation: the variant's products.
template <typename T>
void run_products(T* act, float* y, const T* in, const T* w13, const T* w2, const int32_t* offsets,
                  const int32_t* src_token, int64_t n_tokens, int64_t H, int64_t E, int64_t I, int64_t top_k,
                  cudaStream_t stream) {
  if (variant() == 1) {
    switch (pick_nt(n_tokens, E, top_k)) {
      case 1: launch_products<T, 1>(act, y, in, w13, w2, offsets, src_token, H, E, I, stream); break;
      case 2: launch_products<T, 2>(act, y, in, w13, w2, offsets, src_token, H, E, I, stream); break;
      case 4: launch_products<T, 4>(act, y, in, w13, w2, offsets, src_token, H, E, I, stream); break;
      default: launch_products<T, 8>(act, y, in, w13, w2, offsets, src_token, H, E, I, stream);
    }
    return;
  }
  const int64_t P = n_tokens * top_k;
  const DeviceInfo& dev = device_info(current_device());
  const GemmConfig c = gemm_config(P, E, dev.sm90a(), dev.fast_dram());

  switch (c.stages) {  // (variants 7 and 8 share 2's and 4's kernels)
    case 4: launch_pipelined<T, 4>(act, y, in, w13, w2, offsets, src_token, P, H, E, I, c, stream); break;
    case 8: launch_pipelined<T, 8>(act, y, in, w13, w2, offsets, src_token, P, H, E, I, c, stream); break;
    default: launch_pipelined<T, 6>(act, y, in, w13, w2, offsets, src_token, P, H, E, I, c, stream);
  }
}

void check_decode_shapes(const char* what, const void* in, const void* w13, const void* w2, const void* scratch,
                         int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k) {
  LFM2_CHECK(hidden % 8 == 0 && inter % 8 == 0 && aligned16(in) && aligned16(w13) && aligned16(w2) &&
                 aligned16(scratch),
             what, ": hidden (", hidden, ") and inter (", inter,
             ") must be multiples of 8 and the buffers 16-byte aligned");
  LFM2_CHECK(n_experts >= 1 && n_experts <= moe_gemm::kMaxExperts && n_tokens * top_k < (int64_t(1) << 31), what,
             ": ", n_experts, " experts (at most ", moe_gemm::kMaxExperts, "), ", n_tokens, " tokens");
}

}  // namespace

void moe_experts_decode_force_nt(int nt) {
  LFM2_CHECK(nt == 0 || nt == 1 || nt == 2 || nt == 4 || nt == 8, "moe_experts_decode_force_nt: ", nt);
  g_force_nt = nt;
}

void moe_experts_decode_force_spec_bytes(int bytes) {
  LFM2_CHECK(bytes >= -1, "moe_experts_decode_force_spec_bytes: ", bytes);
  g_spec_bytes = bytes;
}

void moe_experts_decode_force_variant(int variant) {
  LFM2_CHECK(variant >= 0 && variant <= kVariants, "moe_experts_decode_force_variant: ", variant);
  g_variant = variant;
}

int64_t moe_experts_decode_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                         int64_t top_k, int64_t elem_bytes) {
  if (elem_bytes == 4) return moe_experts_scratch_bytes(n_tokens, hidden, n_experts, inter, top_k, elem_bytes);
  return layout(n_tokens, hidden, n_experts, inter, top_k, elem_bytes).total;
}

template <typename T>
void moe_experts_decode(float* x, const T* in, const T* w13, const T* w2, const int32_t* experts, const float* weights,
                        int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                        void* scratch, cudaStream_t stream) {
  if constexpr (std::is_same<T, float>::value) {
    moe_experts<float>(x, in, w13, w2, experts, weights, n_tokens, hidden, n_experts, inter, top_k, scratch, stream);
  } else {
    if (n_tokens == 0) return;
    check_decode_shapes("moe_experts_decode", in, w13, w2, scratch, n_tokens, hidden, n_experts, inter, top_k);
    const Layout l = layout(n_tokens, hidden, n_experts, inter, top_k, sizeof(T));
    char* base = static_cast<char*>(scratch);
    auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
    auto* src_token = reinterpret_cast<int32_t*>(base + l.src_token);
    auto* dest_row = reinterpret_cast<int32_t*>(base + l.dest_row);
    auto* act = reinterpret_cast<T*>(base + l.act);
    auto* y = reinterpret_cast<float*>(base + l.y);
    moe_permute_one_block(offsets, src_token, dest_row, experts, n_tokens, n_experts, top_k, stream);
    run_products<T>(act, y, in, w13, w2, offsets, src_token, n_tokens, hidden, n_experts, inter, top_k, stream);
    moe_combine_rmsnorm<T>(nullptr, x, y, dest_row, weights, nullptr, n_tokens, top_k, hidden, 0.f, stream);
  }
}

int64_t moe_decode_scratch_bytes(int64_t n_tokens, const MoeDims& d, int64_t elem_bytes) {
  const int64_t P = n_tokens * d.top_k;
  if (elem_bytes == 4)  // logits, weights, experts, then moe_experts' scratch
    return align_up(n_tokens * d.n_experts * 4) + 2 * align_up(P * 4) +
           moe_experts_scratch_bytes(n_tokens, d.hidden, d.n_experts, d.inter, d.top_k, 4);
  return layout(n_tokens, d.hidden, d.n_experts, d.inter, d.top_k, elem_bytes).total;
}

template <typename T>
void moe_decode(float* x, T* norm_out, const T* in, const T* gate, const float* expert_bias, const T* w13,
                const T* w2, const float* done, const float* next_norm, float eps, int64_t n_tokens, const MoeDims& d,
                void* scratch, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int64_t H = d.hidden, E = d.n_experts, I = d.inter, k = d.top_k, P = n_tokens * k;
  char* base = static_cast<char*>(scratch);
  if constexpr (std::is_same<T, float>::value) {
    auto* logits = reinterpret_cast<float*>(base);
    auto* weights = reinterpret_cast<float*>(base + align_up(n_tokens * E * 4));
    auto* experts = reinterpret_cast<int32_t*>(base + align_up(n_tokens * E * 4) + align_up(P * 4));
    void* rest = base + align_up(n_tokens * E * 4) + 2 * align_up(P * 4);
    linear_f32out<float>(logits, in, gate, n_tokens, H, E, stream);
    moe_router_drop(weights, experts, logits, expert_bias, done, n_tokens, E, k, d.norm_topk_prob,
                    d.routed_scaling_factor, stream);
    moe_experts<float>(x, in, w13, w2, experts, weights, n_tokens, H, E, I, k, rest, stream);
    if (next_norm) rmsnorm<float>(norm_out, x, next_norm, n_tokens, H, eps, stream);
  } else {
    check_decode_shapes("moe_decode", in, w13, w2, scratch, n_tokens, H, E, I, k);
    const Layout l = layout(n_tokens, H, E, I, k, sizeof(T));
    auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
    auto* src_token = reinterpret_cast<int32_t*>(base + l.src_token);
    auto* dest_row = reinterpret_cast<int32_t*>(base + l.dest_row);
    auto* act = reinterpret_cast<T*>(base + l.act);
    auto* y = reinterpret_cast<float*>(base + l.y);
    auto* weights = reinterpret_cast<float*>(base + l.weights);
    auto* experts = reinterpret_cast<int32_t*>(base + l.experts);
    moe_route_decode<T>(weights, experts, offsets, src_token, dest_row, in, gate, expert_bias, done, n_tokens, H, E, k,
                        d.norm_topk_prob, d.routed_scaling_factor, stream);
    run_products<T>(act, y, in, w13, w2, offsets, src_token, n_tokens, H, E, I, k, stream);
    moe_combine_rmsnorm<T>(norm_out, x, y, dest_row, weights, next_norm, n_tokens, k, H, eps, stream);
  }
}

#define INST(T)                                                                                                      \
  template void moe_experts_decode<T>(float*, const T*, const T*, const T*, const int32_t*, const float*, int64_t,   \
                                      int64_t, int64_t, int64_t, int64_t, void*, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST
#define INST(T)                                                                                                  \
  template void moe_decode<T>(float*, T*, const T*, const T*, const float*, const T*, const T*, const float*,   \
                              const float*, float, int64_t, const MoeDims&, void*, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
