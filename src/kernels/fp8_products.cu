// The FP8 decode products (kernels/cuda/fp8_ops.h): the permutation and the combine of
// moe_experts_decode around moe_decode_gemm_fp8.cuh's two products, and the dense projection as
// one "expert" holding every row.
#include <algorithm>
#include <cmath>

#include <cuda_fp8.h>

#include "common/align.h"
#include "common/cuda_check.h"
#include "common/env.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/fp8_tuning.h"
#include "kernels/cuda/fp8_wgmma.h"
#include "kernels/cuda/moe_decode_gemm_fp8.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

namespace g8 = moe_gemm_fp8;

int n_sms() { return compute_sms(current_device()); }

// One row of 8 values from x (16-bit T or fp32) as floats.
__device__ __forceinline__ void load8(float (&v)[8], const float* x) {
  const float4 a = __ldcg(reinterpret_cast<const float4*>(x)), b = __ldcg(reinterpret_cast<const float4*>(x) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load8(float (&v)[8], const T* x) {
  const uint4 u = __ldcg(reinterpret_cast<const uint4*>(x));
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_f32(h[i]);
}

// The e4m3 of 8 values over s (nearest even, saturating), element 0 in the lowest byte.
__device__ __forceinline__ uint2 e4m3x8(const float (&v)[8], float s) {
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * i] / s, v[4 * i + 1] / s), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(v[4 * i + 2] / s, v[4 * i + 3] / s), __NV_SATFINITE, __NV_E4M3);
    w[i] = lo | (hi << 16);
  }
  return make_uint2(w[0], w[1]);
}

// s = amax / 448 (1 for a zero or non-finite amax), cpu fp8_fake_quantize_rows' scale.
__device__ __forceinline__ float e4m3_scale(float amax) {
  return amax > 0.f && amax <= 3.402823466e38f ? amax / 448.f : 1.f;
}

// The FP8 x FP8 products' activations: rows (the row of x: src[r], or r) to q (rows, cols) e4m3 and
// s, one fp32 scale per row (blocks 0: s (rows)) or per (row, 128 columns) (blocks 1: s (rows,
// ceil(cols / 128))), cpu fp8_fake_quantize_rows' rule (s = amax / 448, x / s to e4m3 nearest even,
// saturating). Block-stride over the rows, 8 columns a thread (cols % 8 == 0). A programmatic
// dependent: lets its own dependent launch, then waits for src / x; then zeroes zero[0..1] (the
// products' unit counters; null: none).
template <typename In>
__global__ void __launch_bounds__(256) quantize_rows_kernel(uint8_t* q, float* s, const In* x, const int32_t* src,
                                                            int64_t rows, int64_t cols, int blocks, int* zero) {
  moe_gemm::griddep_launch();
  moe_gemm::griddep_wait();
  if (zero && blockIdx.x == 0 && threadIdx.x < 2) zero[threadIdx.x] = 0;
  __shared__ float s_red[8];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t kb = (cols + 127) / 128;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const In* xr = x + (src ? int64_t(__ldcg(src + r)) : r) * cols;
    uint8_t* qr = q + r * cols;
    if (blocks) {
      // 16 threads a 128-column group, 16 groups a sweep
      for (int64_t c0 = 8 * tid; c0 - 8 * tid < cols; c0 += 8 * 256) {
        float v[8] = {};
        const bool in = c0 < cols;
        if (in) load8(v, xr + c0);
        float am = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[i]));
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        const float sc = e4m3_scale(am);
        if (in) {
          *reinterpret_cast<uint2*>(qr + c0) = e4m3x8(v, sc);
          if ((tid & 15) == 0) s[r * kb + c0 / 128] = sc;
        }
      }
    } else {
      float am = 0.f;
      for (int64_t c0 = 8 * tid; c0 < cols; c0 += 8 * 256) {
        float v[8];
        load8(v, xr + c0);
#pragma unroll
        for (int i = 0; i < 8; ++i) am = fmaxf(am, fabsf(v[i]));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      if (lane == 0) s_red[warp] = am;
      __syncthreads();
      am = s_red[0];
#pragma unroll
      for (int w = 1; w < 8; ++w) am = fmaxf(am, s_red[w]);
      __syncthreads();  // s_red is free for the next row
      const float sc = e4m3_scale(am);
      if (tid == 0) s[r] = sc;
      for (int64_t c0 = 8 * tid; c0 < cols; c0 += 8 * 256) {
        float v[8];
        load8(v, xr + c0);
        *reinterpret_cast<uint2*>(qr + c0) = e4m3x8(v, sc);
      }
    }
  }
}

template <typename In>
void quantize_rows(uint8_t* q, float* s, const In* x, const int32_t* src, int64_t rows, int64_t cols, int blocks,
                   int* zero, cudaStream_t stream) {
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(rows, 2 * int64_t(n_sms())));
  launch_pdl(quantize_rows_kernel<In>, dim3(unsigned(grid)), dim3(256), 0, stream, true, q, s, x, src, rows, cols,
             blocks, zero);
  CUDA_CHECK_LAUNCH("quantize_rows_kernel (fp8 decode)");
}

// KH warps along k: 2 (128-row units) or 8 (32-row units); XR token slots per pass; max_units
// bounds the grid; F8: e4m3 tokens; BPS blocks an SM.
template <typename T, bool kGateUp, int KH, int XR, bool F8, int BPS>
void launch_bps(g8::Args a, int64_t max_units, const Fp8DecodeTuning& tn, cudaStream_t stream) {
  a.widen = tn.widen;
  a.variant = tn.variant & 17;
  if (tn.variant & 2) a.l2_hints = 0;
  auto kernel = g8::moe_gemm_fp8_kernel<T, kGateUp, KH, XR, F8, BPS>;
  constexpr int smem = g8::Shape<KH, XR, F8, BPS>::kSmem;
  static_assert(smem <= g8::Shape<KH, XR, F8, BPS>::kSmemBlock && g8::Shape<KH, XR, F8, BPS>::kStages >= 4,
                "the pipeline's shared memory");
  launch_resident<g8::Args>(kernel, a, g8::kThreads, smem, max_units, BPS, stream,
                            kGateUp ? "moe_gemm_fp8_kernel (gate/up)" : "moe_gemm_fp8_kernel (down)");
}

// FP8 x FP8 up to 32 token slots: two blocks an SM, each with half the stages (the same weight bytes
// in flight an SM), so that one block's waits at its barriers are covered by the other's work (one
// block of 8 warps left ~60 % of the issue slots idle); tuning bit 6: one block an SM.
template <typename T, bool kGateUp, int KH, int XR, bool F8>
void launch_xr(const g8::Args& a, int64_t max_units, const Fp8DecodeTuning& tn, cudaStream_t stream) {
  if constexpr (F8 && XR <= 32) {
    if (!(tn.variant & 64)) {
      launch_bps<T, kGateUp, KH, XR, F8, 2>(a, max_units, tn, stream);
      return;
    }
  }
  launch_bps<T, kGateUp, KH, XR, F8, 1>(a, max_units, tn, stream);
}

// The token tile as tall as a unit's rows need (one pass), no taller: a short tile leaves room for
// more weight stages in flight (12 / 11 / 9 / 7 of 16 KB at 8 / 16 / 32 / 64 rows). rows: the rows
// a unit is expected to hold at most; the height only sets passes and stages, never an output's
// arithmetic.
template <typename T, bool kGateUp, int KH, bool F8 = false>
void launch(const g8::Args& a, int64_t max_units, int64_t rows, const Fp8DecodeTuning& tn, cudaStream_t stream) {
  if (tn.tile_rows > 0) rows = tn.tile_rows;
  if (rows <= 8)
    launch_xr<T, kGateUp, KH, 8, F8>(a, max_units, tn, stream);
  else if (rows <= 16)
    launch_xr<T, kGateUp, KH, 16, F8>(a, max_units, tn, stream);
  else if (rows <= 32)
    launch_xr<T, kGateUp, KH, 32, F8>(a, max_units, tn, stream);
  else
    launch_xr<T, kGateUp, KH, 64, F8>(a, max_units, tn, stream);
}

// The FP8 x FP8 products on wgmma (fp8_wgmma.h): one or two blocks an SM (wgmma_blocks), units from
// a.ctr, the token tile as launch's (rows: the rows a unit is expected to hold at most).
int wgmma_blocks(const Fp8DecodeTuning& tn) {
  static const int env = int(env_whole("LFM2_FP8_WGMMA_BLOCKS", 0, 0, 2));
  if (tn.wgmma_blocks > 0) return tn.wgmma_blocks;
  if (env > 0) return env;
  return device_info(current_device()).fast_dram() ? 2 : 1;
}

void launch_wgmma(bool gate_up, g8::Args a, int64_t max_units, int64_t rows, const Fp8DecodeTuning& tn,
                  cudaStream_t stream) {
  const Fp8WgmmaKernel k = moe_wgmma_fp8_kernel(
      gate_up, int(std::min<int64_t>(64, tn.tile_rows > 0 ? tn.tile_rows : rows)), wgmma_blocks(tn));
  a.variant = tn.variant & 16;
  launch_resident<g8::Args>(k.fn, a, g8::kThreads, k.smem, max_units, k.bps, stream,
                            gate_up ? "moe_wgmma_fp8_kernel (gate/up)" : "moe_wgmma_fp8_kernel (down)");
}

// Whether the MoE's FP8 x FP8 products run on wgmma: compute capability 9.0 (sm_90a code), the
// units from the counters (tuning: Fp8DecodeTuning::wgmma).
bool use_wgmma(const Fp8DecodeTuning& tn, bool counters) {
  if (tn.wgmma == 0 || !counters) return false;
  return device_info(current_device()).sm90a();
}

// The routed products' scratch (fp8_ops.h): F8, the permuted rows in e4m3 (P, H) and their scales,
// act fp32 (P, I), its e4m3 and scales, y (P, H) fp32, the two products' unit counters; the widening
// products' act (P, I) T and y fit in it.
struct RoutedLayout {
  int64_t xq, xs, act, aq, as, y, ctr, total;
};
RoutedLayout routed_layout(int64_t P, int64_t H, int64_t I) {
  RoutedLayout l{};
  l.xs = l.xq + align_up(P * H);
  l.act = l.xs + align_up(P * ((H + 127) / 128) * 4);
  l.aq = l.act + align_up(P * I * 4);
  l.as = l.aq + align_up(P * I);
  l.y = l.as + align_up(P * ((I + 127) / 128) * 4);
  l.ctr = l.y + align_up(P * H * 4);
  l.total = l.ctr + align_up(2 * 4);
  return l;
}

void check_shapes(const char* what, const void* in, const void* w, const void* w2, int64_t k, int64_t r) {
  LFM2_CHECK(k % 16 == 0 && r % 8 == 0 && aligned16(in) && aligned16(w) && (!w2 || aligned16(w2)), what,
             ": the sizes (", k, ", ", r, ") must be multiples of 16 and 8 and the buffers 16-byte aligned");
}

}  // namespace

int64_t moe_experts_decode_fp8_routed_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t inter, int64_t top_k,
                                                    int64_t) {
  return routed_layout(n_tokens * top_k, hidden, inter).total;
}

int64_t moe_experts_decode_fp8_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter,
                                             int64_t top_k, int64_t elem_bytes) {
  const int64_t P = n_tokens * top_k;
  return align_up((n_experts + 1) * 4) + 2 * align_up(P * 4) +
         moe_experts_decode_fp8_routed_scratch_bytes(n_tokens, hidden, inter, top_k, elem_bytes);
}

template <typename T>
void moe_experts_decode_fp8_routed_tuned(float* x, T* norm_out, const T* in, const uint8_t* w13, const float* s13,
                                         const uint8_t* w2, const float* s2, Fp8Scheme scheme, const int32_t* offsets,
                                         const int32_t* src_token, const int32_t* dest_row, const float* weights,
                                         const float* norm_weight, float eps, int64_t n_tokens, int64_t hidden,
                                         int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                                         const Fp8DecodeTuning& tn, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int64_t H = hidden, E = n_experts, I = inter, P = n_tokens * top_k;
  check_shapes("moe_experts_decode_fp8", in, w13, w2, H, I);
  LFM2_CHECK(I % 16 == 0 && aligned16(scratch) && E >= 1 && E <= g8::kMaxExperts && P < (int64_t(1) << 31),
             "moe_experts_decode_fp8: inter ", I, " (a multiple of 16), ", E, " experts (at most ", g8::kMaxExperts,
             "), ", n_tokens, " tokens, an aligned scratch");
  const RoutedLayout l = routed_layout(P, H, I);
  char* base = static_cast<char*>(scratch);
  auto* y = reinterpret_cast<float*>(base + l.y);
  const int blocks = scheme == Fp8Scheme::Block128;
  // an expert's rows: P / E on average; the tile covers the mean + 2.5 standard deviations of a
  // uniform router (a hotter expert takes a second pass over its weights), never more than n_tokens.
  // H100, one LFM2-8B-A1B layer, tiles forced (docs/fp8.md): 8 / 32 / 64 / 128 / 256 tokens are
  // fastest at 8 / 16 / 16 / 32 / 64 rows, which this picks
  const double mean = double(P) / double(E);
  const int64_t rows = std::min<int64_t>(n_tokens, int64_t(std::ceil(mean + 2.5 * std::sqrt(mean))));
  const int64_t touched = std::min(E, P);
  const int64_t units13 = touched * ((I + 63) / 64), units2 = touched * ((H + 127) / 128);
  if (tn.act_fp8) {
    // FP8 x FP8: the permuted tokens and act quantized per row or (row, 128 columns) by the scheme
    auto* xq = reinterpret_cast<uint8_t*>(base + l.xq);
    auto* xs = reinterpret_cast<float*>(base + l.xs);
    auto* act = reinterpret_cast<float*>(base + l.act);
    auto* aq = reinterpret_cast<uint8_t*>(base + l.aq);
    auto* as = reinterpret_cast<float*>(base + l.as);
    // the products take their units from two counters, zeroed by the tokens' quantization (which
    // gate/up waits for, and down runs after); tuning bit 5: each block a fixed share instead
    auto* ctr = tn.variant & 32 ? nullptr : reinterpret_cast<int*>(base + l.ctr);
    g8::Args a{w13, s13, xq, offsets, nullptr, act, H, I, int(E), 0, blocks, g8::kOutT, 1};
    a.xs = xs;
    a.ctr = ctr;
    g8::Args b{w2, s2, aq, offsets, nullptr, y, I, H, int(E), 0, blocks, g8::kOutF32, 1};
    b.xs = as;
    b.ctr = ctr ? ctr + 1 : nullptr;
    const bool wg = use_wgmma(tn, ctr != nullptr);
    if (!(tn.variant & 4)) {
      quantize_rows<T>(xq, xs, in, src_token, P, H, blocks, ctr, stream);
      if (wg)
        launch_wgmma(true, a, units13, rows, tn, stream);
      else
        launch<T, true, 2, true>(a, units13, rows, tn, stream);
    } else if (ctr) {
      CUDA_CHECK(cudaMemsetAsync(ctr, 0, 2 * sizeof(int), stream));  // bench: down alone
    }
    if (!(tn.variant & 8)) {
      quantize_rows<float>(aq, as, act, nullptr, P, I, blocks, nullptr, stream);
      if (wg)
        launch_wgmma(false, b, units2, rows, tn, stream);
      else
        launch<T, false, 2, true>(b, units2, rows, tn, stream);
    }
  } else {
    auto* act = reinterpret_cast<T*>(base + l.act);
    const g8::Args a{w13, s13, in, offsets, src_token, act, H, I, int(E), 0, blocks, g8::kOutT, 1};
    if (!(tn.variant & 4)) launch<T, true, 2>(a, units13, rows, tn, stream);
    const g8::Args b{w2, s2, act, offsets, nullptr, y, I, H, int(E), 0, blocks, g8::kOutF32, 1};
    if (!(tn.variant & 8)) launch<T, false, 2>(b, units2, rows, tn, stream);
  }
  if (tn.variant & 12) return;
  moe_combine_rmsnorm<T>(norm_out, x, y, dest_row, weights, norm_weight, n_tokens, top_k, H, eps, stream);
}

template <typename T>
void moe_experts_decode_fp8_routed(float* x, T* norm_out, const T* in, const uint8_t* w13, const float* s13,
                                   const uint8_t* w2, const float* s2, Fp8Scheme scheme, const int32_t* offsets,
                                   const int32_t* src_token, const int32_t* dest_row, const float* weights,
                                   const float* norm_weight, float eps, int64_t n_tokens, int64_t hidden,
                                   int64_t n_experts, int64_t inter, int64_t top_k, void* scratch,
                                   cudaStream_t stream) {
  moe_experts_decode_fp8_routed_tuned<T>(x, norm_out, in, w13, s13, w2, s2, scheme, offsets, src_token, dest_row,
                                         weights, norm_weight, eps, n_tokens, hidden, n_experts, inter, top_k, scratch,
                                         Fp8DecodeTuning{}, stream);
}

template <typename T>
void moe_experts_decode_fp8_tuned(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                                  const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights,
                                  int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                                  void* scratch, const Fp8DecodeTuning& tn, cudaStream_t stream) {
  if (n_tokens == 0) return;
  const int64_t E = n_experts, P = n_tokens * top_k;
  check_shapes("moe_experts_decode_fp8", in, w13, w2, hidden, inter);
  LFM2_CHECK(E >= 1 && E <= g8::kMaxExperts && aligned16(scratch), "moe_experts_decode_fp8: ", E,
             " experts (at most ", g8::kMaxExperts, "), an aligned scratch");
  // the scratch: offsets, src_token, dest_row, then the routed products' (moe_experts_decode_fp8_scratch_bytes)
  char* base = static_cast<char*>(scratch);
  auto* offsets = reinterpret_cast<int32_t*>(base);
  auto* src_token = reinterpret_cast<int32_t*>(base + align_up((E + 1) * 4));
  auto* dest_row = reinterpret_cast<int32_t*>(base + align_up((E + 1) * 4) + align_up(P * 4));
  void* rest = base + align_up((E + 1) * 4) + 2 * align_up(P * 4);
  moe_permute_one_block(offsets, src_token, dest_row, experts, n_tokens, E, top_k, stream);
  moe_experts_decode_fp8_routed_tuned<T>(x, static_cast<T*>(nullptr), in, w13, s13, w2, s2, scheme, offsets,
                                         src_token, dest_row, weights, nullptr, 0.f, n_tokens, hidden, n_experts,
                                         inter, top_k, rest, tn, stream);
}

template <typename T>
void moe_experts_decode_fp8(float* x, const T* in, const uint8_t* w13, const float* s13, const uint8_t* w2,
                            const float* s2, Fp8Scheme scheme, const int32_t* experts, const float* weights,
                            int64_t n_tokens, int64_t hidden, int64_t n_experts, int64_t inter, int64_t top_k,
                            void* scratch, cudaStream_t stream) {
  moe_experts_decode_fp8_tuned<T>(x, in, w13, s13, w2, s2, scheme, experts, weights, n_tokens, hidden, n_experts,
                                  inter, top_k, scratch, Fp8DecodeTuning{}, stream);
}

template <typename T>
void linear_fp8_decode_tuned(void* out, Fp8Out out_kind, const T* in, const uint8_t* w, const float* s,
                             Fp8Scheme scheme, int64_t n_rows, int64_t n_in, int64_t n_out, const Fp8DecodeTuning& tn,
                             cudaStream_t stream) {
  if (n_rows == 0) return;
  check_shapes("linear_fp8_decode", in, w, nullptr, n_in, n_out);
  LFM2_CHECK(n_rows < (int64_t(1) << 31) && aligned16(out), "linear_fp8_decode: ", n_rows, " rows, an aligned out");
  const int mode = out_kind == Fp8Out::T ? g8::kOutT : out_kind == Fp8Out::F32 ? g8::kOutF32 : g8::kOutAddF32;
  const g8::Args a{w, s, in, nullptr, nullptr, out, n_in, n_out, 1, int(n_rows), scheme == Fp8Scheme::Block128,
                   mode, 1};
  // 32-row units (4x the blocks) for the small projections (n_out < 4096: qkv, out, dense w2 of
  // LFM2-8B-A1B), 128-row units past them; by the shape only, so that a row's bits never depend on
  // n_rows
  const int64_t units128 = (n_out + 127) / 128;
  const int kh = tn.linear_kh ? tn.linear_kh : n_out < 4096 ? 8 : 2;
  if (kh == 2)
    launch<T, false, 2>(a, units128, n_rows, tn, stream);
  else
    launch<T, false, 8>(a, (n_out + 31) / 32, n_rows, tn, stream);
}

template <typename T>
void linear_fp8_decode(void* out, Fp8Out out_kind, const T* in, const uint8_t* w, const float* s, Fp8Scheme scheme,
                       int64_t n_rows, int64_t n_in, int64_t n_out, cudaStream_t stream) {
  linear_fp8_decode_tuned<T>(out, out_kind, in, w, s, scheme, n_rows, n_in, n_out, Fp8DecodeTuning{}, stream);
}

#define INST(T)                                                                                                     \
  template void moe_experts_decode_fp8<T>(float*, const T*, const uint8_t*, const float*, const uint8_t*,          \
                                          const float*, Fp8Scheme, const int32_t*, const float*, int64_t, int64_t,   \
                                          int64_t, int64_t, int64_t, void*, cudaStream_t);                          \
  template void moe_experts_decode_fp8_tuned<T>(float*, const T*, const uint8_t*, const float*, const uint8_t*,    \
                                                const float*, Fp8Scheme, const int32_t*, const float*, int64_t,     \
                                                int64_t, int64_t, int64_t, int64_t, void*, const Fp8DecodeTuning&,  \
                                                cudaStream_t);                                                      \
  template void moe_experts_decode_fp8_routed<T>(float*, T*, const T*, const uint8_t*, const float*, const uint8_t*, \
                                                 const float*, Fp8Scheme, const int32_t*, const int32_t*,          \
                                                 const int32_t*, const float*, const float*, float, int64_t,       \
                                                 int64_t, int64_t, int64_t, int64_t, void*, cudaStream_t);         \
  template void moe_experts_decode_fp8_routed_tuned<T>(                                                             \
      float*, T*, const T*, const uint8_t*, const float*, const uint8_t*, const float*, Fp8Scheme, const int32_t*,  \
      const int32_t*, const int32_t*, const float*, const float*, float, int64_t, int64_t, int64_t, int64_t,        \
      int64_t, void*, const Fp8DecodeTuning&, cudaStream_t);                                                        \
  template void linear_fp8_decode<T>(void*, Fp8Out, const T*, const uint8_t*, const float*, Fp8Scheme, int64_t,      \
                                     int64_t, int64_t, cudaStream_t);                                               \
  template void linear_fp8_decode_tuned<T>(void*, Fp8Out, const T*, const uint8_t*, const float*, Fp8Scheme,       \
                                           int64_t, int64_t, int64_t, const Fp8DecodeTuning&, cudaStream_t);
INST(__nv_bfloat16)
INST(__half)
#undef INST

}  // namespace lfm2::cuda
