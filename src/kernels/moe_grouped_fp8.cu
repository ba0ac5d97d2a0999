// The FP8 grouped GEMM's launchers (grouped_gemm_fp8.h): the e4m3 quantization of expert-ordered
// rows, fused into the gather (gate/up's input) or the SwiGLU (down's input), with one scale per
// row or per (row, 128 columns), and the checked call into the CUTLASS kernel
// (moe_grouped_gemm_fp8.cu).
#include <algorithm>

#include <cuda_fp8.h>

#include "common/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/moe_rows.cuh"
#include "kernels/cuda/row_norm.cuh"
#include "kernels/cuda/swiglu_e4m3.cuh"

namespace lfm2::cuda {
namespace {

constexpr int kGroup = 128;          // columns per scale
constexpr int kVec = 8;              // columns per lane and load (16 bytes of a 16-bit type)
constexpr int kChunk = 32 * kVec;    // columns per warp step: two groups, a half-warp each
using swiglu_e4m3::scale_of;  // amax / 448, 1 for a zero group
using swiglu_e4m3::silu_fast;
constexpr int kWarpsPerBlock = 8;
constexpr int kCachedSteps = 8;      // the scaled SwiGLU's steps kept in registers: 2,048 columns

// Eight consecutive values of a source row as fp32: the 16-bit rows (gathered) ...
template <typename T>
struct RowSource {
  static constexpr bool kByFactor = false;  // codes e4m3(v / s), bit for bit cpu::moe_quantize_e4m3's
  const T* x;
  const int32_t* src_row;
  int64_t cols;
  using Row = const T*;
  // a padding row (src -1, moe_pad_rows) has none: the kernel writes its zero codes and scales 1
  __device__ __forceinline__ bool empty(int64_t r) const { return src_row && src_row[r] < 0; }
  __device__ __forceinline__ Row row(int64_t r, int, int64_t) const { return x + (src_row ? src_row[r] : r) * cols; }
  __device__ __forceinline__ void load(float (&v)[kVec], const T* base, int64_t c) const {
    alignas(16) T t[kVec];
    *reinterpret_cast<uint4*>(t) = *reinterpret_cast<const uint4*>(base + c);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = to_f32(t[j]);
  }
};

// ... or the SwiGLU of a [gate | up] row of bf16, silu(g) * u in fp32.
struct SwigluSource {
  static constexpr bool kByFactor = true;
  const __nv_bfloat16* gate_up;
  int64_t cols;           // inter
  const int32_t* pad_src;  // or null: a row with pad_src[r] < 0 is padding
  __device__ __forceinline__ bool empty(int64_t r) const { return pad_src && pad_src[r] < 0; }
  using Row = const __nv_bfloat16*;
  __device__ __forceinline__ Row row(int64_t r, int, int64_t) const { return gate_up + r * 2 * cols; }
  __device__ __forceinline__ void load(float (&v)[kVec], const __nv_bfloat16* base, int64_t c) const {
    alignas(16) __nv_bfloat16 g[kVec], u[kVec];
    *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(base + c);
    *reinterpret_cast<uint4*>(u) = *reinterpret_cast<const uint4*>(base + cols + c);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      v[j] = silu_fast(to_f32(g[j])) * to_f32(u[j]);
    }
  }
};

// ... or the SwiGLU of a row of gate/up's raw sums (moe_grouped_matmul_fp8_raw), each scaled by
// the row's activation scale and the output row's weight scale first.
struct SwigluScaledSource {
  static constexpr bool kByFactor = true;
  const __nv_bfloat16* gate_up;
  const float* in_scales;  // gate/up's input scales, (row, n_in / 128) k-block major per expert
  const float* w_scales;   // (E, n_in / 128, 2 cols)
  int64_t cols;            // inter
  int64_t in_groups;       // n_in / 128
  struct Row {
    const __nv_bfloat16* gu;
    const float* sw;  // the expert's k block 0
    float sa;
  };
  __device__ __forceinline__ Row row(int64_t r, int e, int64_t r0) const {
    return {gate_up + r * 2 * cols, w_scales + int64_t(e) * in_groups * 2 * cols, in_scales[r0 * in_groups + (r - r0)]};
  }
  __device__ __forceinline__ void load(float (&v)[kVec], const Row& b, int64_t c) const {
    alignas(16) __nv_bfloat16 g[kVec], u[kVec];
    alignas(16) float sg[kVec], su[kVec];
    *reinterpret_cast<uint4*>(g) = *reinterpret_cast<const uint4*>(b.gu + c);
    *reinterpret_cast<uint4*>(u) = *reinterpret_cast<const uint4*>(b.gu + cols + c);
    *reinterpret_cast<float4*>(sg) = __ldg(reinterpret_cast<const float4*>(b.sw + c));
    *reinterpret_cast<float4*>(sg + 4) = __ldg(reinterpret_cast<const float4*>(b.sw + c + 4));
    *reinterpret_cast<float4*>(su) = __ldg(reinterpret_cast<const float4*>(b.sw + cols + c));
    *reinterpret_cast<float4*>(su + 4) = __ldg(reinterpret_cast<const float4*>(b.sw + cols + c + 4));
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float gf = to_f32(g[j]) * b.sa * sg[j], uf = to_f32(u[j]) * b.sa * su[j];
      v[j] = silu_fast(gf) * uf;
    }
  }
};

__device__ __forceinline__ float abs_max(const float (&v)[kVec]) {
  float m = 0;
#pragma unroll
  for (int j = 0; j < kVec; ++j) m = fmaxf(m, fabsf(v[j]));
  return m;
}

// The factor of the codes: the SwiGLU's (swiglu_e4m3::code_factor), 0 (codes by v / s) for the rest.
template <class Src>
__device__ __forceinline__ float code_factor(float amax) {
  return Src::kByFactor ? swiglu_e4m3::code_factor(amax) : 0.f;
}

// e4m3(v / s), or e4m3(v * r) for a factor r > 0; RNE and saturating (the hardware conversion;
// fp8_quantize's rule), 8 bytes.
__device__ __forceinline__ uint2 to_e4m3(const float (&v)[kVec], float s, float r) {
  uint32_t w[2] = {0, 0};
  auto put = [&w](int j, float a, float b) { w[j / 4] |= swiglu_e4m3::e4m3x2_sat(a, b) << (8 * (j % 4)); };
  if (r > 0) {  // one branch for the 8 values, not a division computed for each and dropped
#pragma unroll
    for (int j = 0; j < kVec; j += 2) put(j, v[j] * r, v[j + 1] * r);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; j += 2) put(j, v[j] / s, v[j + 1] / s);
  }
  return make_uint2(w[0], w[1]);
}

// A padding row's zero codes and scales 1 (what the quantization of a zero row writes).
__device__ __forceinline__ void zero_row(uint8_t* qrow, float* srow, int64_t cols, int64_t m, int lane) {
  for (int64_t c = lane; c < cols / 16; c += 32) reinterpret_cast<uint4*>(qrow)[c] = make_uint4(0, 0, 0, 0);
  for (int64_t g = lane; g < cols / kGroup; g += 32) srow[g * m] = 1.f;
}

// One warp per row (rows from offsets[n_experts] on belong to no expert and are skipped), 8
// columns a lane, 256 a step; the scales at the row's expert's k-block-major places (the expert by
// binary search over the offsets). Per (row, 128 columns): each half-warp's group in one pass. Per
// row: the row's amax first, then a second pass over the (cached) row, and its one scale written
// for every 128 columns (CUTLASS's grouped kernel derives the scale layout from the problem shape).
template <class Src>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    quantize_e4m3_kernel(uint8_t* q, float* scales, Src src, const int32_t* offsets, int64_t n_rows, int n_experts,
                         bool per_row) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n_rows || row >= offsets[n_experts]) return;
  const int lane = threadIdx.x & 31;
  const int64_t cols = src.cols, G = cols / kGroup;
  const typename Src::Row base = src.row(row, 0, 0);  // the unscaled sources: no expert needed
  uint8_t* qrow = q + row * cols;
  int64_t r0 = 0, m = 0;
  row_expert(row, offsets, n_experts, r0, m);
  float* srow = scales + r0 * G + (row - r0);  // group g's scale at srow[g * m]
  if (src.empty(row)) return zero_row(qrow, srow, cols, m, lane);
  float v[kVec];
  if (per_row) {
    float amax = 0;
#pragma unroll 4
    for (int64_t c = lane * kVec; c < cols; c += kChunk) {
      src.load(v, base, c);
      amax = fmaxf(amax, abs_max(v));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = scale_of(amax), r = code_factor<Src>(amax);
#pragma unroll 4
    for (int64_t c = lane * kVec; c < cols; c += kChunk) {
      src.load(v, base, c);
      *reinterpret_cast<uint2*>(qrow + c) = to_e4m3(v, s, r);
    }
    for (int64_t g = lane; g < G; g += 32) srow[g * m] = s;
    return;
  }
  // cols % 128 == 0: a half-warp is wholly inside the row or wholly past it, and the warp's
  // shuffles stay converged (lanes past the end take part with zeros)
#pragma unroll 4
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t c = c0 + lane * kVec;
    const bool in = c < cols;
    if (in) {
      src.load(v, base, c);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = 0;
    }
    float amax = abs_max(v);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (!in) continue;
    const float s = scale_of(amax);
    *reinterpret_cast<uint2*>(qrow + c) = to_e4m3(v, s, code_factor<Src>(amax));
    if ((lane & 15) == 0) srow[(c / kGroup) * m] = s;
  }
}

// Per row for the scaled SwiGLU (its source needs the row's expert): one warp per row as above, the
// first kCachedSteps steps (2,048 columns) kept in registers, so such a row is read once (H100,
// helper CH8's call 1: 0.198 ms at 8,192 tokens x top-4; a block of 256 threads a row, call 2:
// 0.244). The same amax, scale and codes as the two-pass loop.
template <class Src>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    quantize_row_cached_kernel(uint8_t* q, float* scales, Src src, const int32_t* offsets, int64_t n_rows,
                               int n_experts) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n_rows || row >= offsets[n_experts]) return;
  const int lane = threadIdx.x & 31;
  const int64_t cols = src.cols, G = cols / kGroup;
  int64_t r0 = 0, m = 0;
  const int expert = row_expert(row, offsets, n_experts, r0, m);
  const typename Src::Row base = src.row(row, expert, r0);
  uint8_t* qrow = q + row * cols;
  float cache[kCachedSteps][kVec], v[kVec];
  float amax = 0;
#pragma unroll
  for (int i = 0; i < kCachedSteps; ++i) {
    const int64_t c = lane * kVec + int64_t(i) * kChunk;
    if (c < cols) {
      src.load(cache[i], base, c);
      amax = fmaxf(amax, abs_max(cache[i]));
    }
  }
#pragma unroll 4
  for (int64_t c = lane * kVec + int64_t(kCachedSteps) * kChunk; c < cols; c += kChunk) {
    src.load(v, base, c);
    amax = fmaxf(amax, abs_max(v));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = scale_of(amax), r = code_factor<Src>(amax);
#pragma unroll
  for (int i = 0; i < kCachedSteps; ++i) {
    const int64_t c = lane * kVec + int64_t(i) * kChunk;
    if (c < cols) *reinterpret_cast<uint2*>(qrow + c) = to_e4m3(cache[i], s, r);
  }
#pragma unroll 4
  for (int64_t c = lane * kVec + int64_t(kCachedSteps) * kChunk; c < cols; c += kChunk) {
    src.load(v, base, c);
    *reinterpret_cast<uint2*>(qrow + c) = to_e4m3(v, s, r);
  }
  float* srow = scales + r0 * G + (row - r0);  // group g's scale at srow[g * m]
  for (int64_t g = lane; g < G; g += 32) srow[g * m] = s;
}

// One warp per expert-ordered row (rows from offsets[n_experts] on skipped): its token's codes, 16
// bytes a lane, and its scales from (g * s_ld + token) to moe_quantize_e4m3's places.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gather_e4m3_kernel(uint8_t* q, float* scales, const uint8_t* q_in, const float* s_in, int64_t s_ld,
                       const int32_t* src_row, const int32_t* offsets, int64_t n_rows, int n_experts, int64_t cols) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n_rows || row >= offsets[n_experts]) return;
  const int lane = threadIdx.x & 31;
  const int64_t src = src_row[row], G = cols / kGroup;
  int64_t r0 = 0, m = 0;
  row_expert(row, offsets, n_experts, r0, m);
  if (src < 0) return zero_row(q + row * cols, scales + r0 * G + (row - r0), cols, m, lane);
  const uint4* from = reinterpret_cast<const uint4*>(q_in + src * cols);
  uint4* to = reinterpret_cast<uint4*>(q + row * cols);
  for (int64_t c = lane; c < cols / 16; c += 32) to[c] = from[c];
  float* srow = scales + r0 * G + (row - r0);
  for (int64_t g = lane; g < G; g += 32) srow[g * m] = s_in[g * s_ld + src];
}

void check_quantize(const char* what, const void* q, const void* x, int64_t n_rows, int64_t n_experts,
                    int64_t cols) {
  LFM2_CHECK(cols > 0 && cols % kGroup == 0, what, ": ", cols, " columns (a multiple of 128)");
  LFM2_CHECK(n_experts >= 1 && n_experts < (int64_t(1) << 31), what, ": ", n_experts, " experts");
  LFM2_CHECK(aligned16(q) && aligned16(x), what, ": 16-byte aligned rows");
  LFM2_CHECK(n_rows / kWarpsPerBlock < (int64_t(1) << 31), what, ": ", n_rows, " rows is too many for one launch");
}

unsigned quantize_blocks(int64_t n_rows) { return unsigned((n_rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

template <typename T>
void moe_quantize_e4m3(uint8_t* q, float* scales, const T* x, const int32_t* src_row, const int32_t* offsets,
                       int64_t n_rows, int64_t n_experts, int64_t cols, bool per_row, cudaStream_t stream) {
  check_quantize("moe_quantize_e4m3", q, x, n_rows, n_experts, cols);
  if (n_rows == 0) return;
  quantize_e4m3_kernel<RowSource<T>><<<quantize_blocks(n_rows), kWarpsPerBlock * 32, 0, stream>>>(
      q, scales, RowSource<T>{x, src_row, cols}, offsets, n_rows, int(n_experts), per_row);
  CUDA_CHECK_LAUNCH("quantize_e4m3_kernel");
}

void moe_gather_e4m3(uint8_t* q, float* scales, const uint8_t* q_in, const float* s_in, int64_t s_ld,
                     const int32_t* src_row, const int32_t* offsets, int64_t n_rows, int64_t n_experts, int64_t cols,
                     cudaStream_t stream) {
  check_quantize("moe_gather_e4m3", q, q_in, n_rows, n_experts, cols);
  if (n_rows == 0) return;
  gather_e4m3_kernel<<<quantize_blocks(n_rows), kWarpsPerBlock * 32, 0, stream>>>(
      q, scales, q_in, s_in, s_ld, src_row, offsets, n_rows, int(n_experts), cols);
  CUDA_CHECK_LAUNCH("gather_e4m3_kernel");
}

void moe_swiglu_quantize_e4m3(uint8_t* q, float* scales, const __nv_bfloat16* gate_up, const int32_t* pad_src,
                              const int32_t* offsets, int64_t n_rows, int64_t n_experts, int64_t inter, bool per_row,
                              cudaStream_t stream) {
  check_quantize("moe_swiglu_quantize_e4m3", q, gate_up, n_rows, n_experts, inter);
  if (n_rows == 0) return;
  quantize_e4m3_kernel<SwigluSource><<<quantize_blocks(n_rows), kWarpsPerBlock * 32, 0, stream>>>(
      q, scales, SwigluSource{gate_up, inter, pad_src}, offsets, n_rows, int(n_experts), per_row);
  CUDA_CHECK_LAUNCH("quantize_e4m3_kernel (SwiGLU)");
}

void moe_swiglu_quantize_e4m3_scaled(uint8_t* q, float* scales, const __nv_bfloat16* gate_up, const float* in_scales,
                                     const float* w13_scales, const int32_t* offsets, int64_t n_rows,
                                     int64_t n_experts, int64_t n_in, int64_t inter, cudaStream_t stream) {
  check_quantize("moe_swiglu_quantize_e4m3_scaled", q, gate_up, n_rows, n_experts, inter);
  LFM2_CHECK(n_in > 0 && n_in % kGroup == 0 && aligned16(w13_scales), "moe_swiglu_quantize_e4m3_scaled: n_in ", n_in,
             " (a multiple of 128) and 16-byte aligned weight scales");
  if (n_rows == 0) return;
  quantize_row_cached_kernel<SwigluScaledSource><<<quantize_blocks(n_rows), kWarpsPerBlock * 32, 0, stream>>>(
      q, scales, SwigluScaledSource{gate_up, in_scales, w13_scales, inter, n_in / kGroup}, offsets, n_rows,
      int(n_experts));
  CUDA_CHECK_LAUNCH("quantize_e4m3_kernel (scaled SwiGLU)");
}

// The padded product's CUTLASS workspace (the persistent scheduler's; none without split-K) does not
// grow with the rows, which run_fp8_padded checks.
constexpr int64_t kPaddedWorkspaceRows = 128;

int64_t moe_grouped_matmul_fp8_workspace_bytes(int64_t n_experts) {
  const int sms = compute_sms(current_device());
  return int64_t(std::max({grouped::fp8_workspace_bytes(n_experts, sms),
                           grouped::fp8_plain_workspace_bytes(n_experts, sms),
                           grouped::fp8_padded_workspace_bytes(kPaddedWorkspaceRows, 128, 128, sms),
                           grouped::fp8_padded_swiglu_workspace_bytes(kPaddedWorkspaceRows, 256, 128, sms)}));
}

namespace {
// The products' checks; returns the device.
int check_product(const char* what, const void* out, const void* in, const void* w, const void* workspace,
                  int64_t max_rows, int64_t n_experts, int64_t n_in, int64_t n_out) {
  LFM2_CHECK(n_experts >= 1 && n_in % 128 == 0 && n_out % 128 == 0 && n_in > 0 && n_in < (int64_t(1) << 31) &&
                 n_out < (int64_t(1) << 31) && max_rows < (int64_t(1) << 31),
             what, ": ", max_rows, " rows, ", n_experts, " experts, ", n_in, " -> ", n_out,
             " (n_in, n_out multiples of 128)");
  const int device = current_device();
  const DeviceInfo& info = device_info(device);
  LFM2_CHECK(info.sm90a(), what, ": built for Hopper (sm_90a); device ", device, " is sm_",
             info.major, info.minor);
  LFM2_CHECK(aligned16(in) && aligned16(w) && aligned16(out) && aligned16(workspace), what,
             ": 16-byte aligned operands and a workspace");
  return device;
}
}  // namespace

void moe_grouped_matmul_fp8_raw(__nv_bfloat16* out, const uint8_t* in, const uint8_t* w, const int32_t* offsets,
                                int64_t max_rows, int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace,
                                cudaStream_t stream) {
  if (max_rows == 0 || n_out == 0) return;
  const int device =
      check_product("moe_grouped_matmul_fp8_raw", out, in, w, workspace, max_rows, n_experts, n_in, n_out);
  grouped::run_fp8_plain(out, in, w, offsets, n_experts, n_in, n_out, workspace, compute_sms(device), device, stream);
}

void moe_grouped_matmul_fp8(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                            const float* w_scales, Fp8Scheme w_scheme, const int32_t* offsets, int64_t max_rows,
                            int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, cudaStream_t stream) {
  if (max_rows == 0 || n_out == 0) return;
  const int device = check_product("moe_grouped_matmul_fp8", out, in, w, workspace, max_rows, n_experts, n_in, n_out);
  LFM2_CHECK(reinterpret_cast<uintptr_t>(in_scales) % 4 == 0 && reinterpret_cast<uintptr_t>(w_scales) % 4 == 0,
             "moe_grouped_matmul_fp8: 4-byte aligned scales");
  grouped::run_fp8(out, in, in_scales, w, w_scales, w_scheme == Fp8Scheme::Channel, offsets, n_experts, n_in, n_out,
                   workspace, compute_sms(device), device, stream);
}

void moe_grouped_matmul_fp8_padded(__nv_bfloat16* out, const uint8_t* in, const float* in_scales, const uint8_t* w,
                                   const float* w_scales, const int32_t* tile_expert, const int32_t* used_rows,
                                   int64_t m_pad, int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace,
                                   cudaStream_t stream) {
  if (m_pad == 0 || n_out == 0) return;
  const int device =
      check_product("moe_grouped_matmul_fp8_padded", out, in, w, workspace, m_pad, n_experts, n_in, n_out);
  LFM2_CHECK(m_pad % 128 == 0, "moe_grouped_matmul_fp8_padded: ", m_pad, " rows (a multiple of 128)");
  LFM2_CHECK(reinterpret_cast<uintptr_t>(in_scales) % 16 == 0 && reinterpret_cast<uintptr_t>(w_scales) % 4 == 0,
             "moe_grouped_matmul_fp8_padded: 16-byte aligned activation scales, 4-byte aligned weight scales");
  const int sms = compute_sms(device);
  LFM2_CHECK(grouped::fp8_padded_workspace_bytes(m_pad, n_out, n_in, sms) <=
                 grouped::fp8_padded_workspace_bytes(kPaddedWorkspaceRows, 128, 128, sms),
             "moe_grouped_matmul_fp8_padded: CUTLASS asks for a workspace that grows with the problem");
  grouped::run_fp8_padded(out, in, in_scales, w, w_scales, tile_expert, used_rows, m_pad, n_experts, n_in, n_out,
                          workspace, sms, device, stream);
}

void moe_grouped_matmul_fp8_padded_swiglu(uint8_t* q, float* scales, const uint8_t* in, const float* in_scales,
                                          const uint8_t* w13, const float* w13_scales, const int32_t* tile_expert,
                                          const int32_t* used_rows, int64_t m_pad, int64_t n_experts, int64_t n_in,
                                          int64_t inter, void* workspace, cudaStream_t stream) {
  if (m_pad == 0) return;
  const char* what = "moe_grouped_matmul_fp8_padded_swiglu";
  LFM2_CHECK(moe_padded_swiglu_fits(inter), what, ": inter ", inter, " (a multiple of 256)");
  const int device = check_product(what, q, in, w13, workspace, m_pad, n_experts, n_in, 2 * inter);
  LFM2_CHECK(m_pad % 128 == 0, what, ": ", m_pad, " rows (a multiple of 128)");
  LFM2_CHECK(reinterpret_cast<uintptr_t>(in_scales) % 16 == 0 && reinterpret_cast<uintptr_t>(w13_scales) % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(scales) % 4 == 0,
             what, ": 16-byte aligned activation scales, 4-byte aligned weight and output scales");
  const int sms = compute_sms(device);
  LFM2_CHECK(grouped::fp8_padded_swiglu_workspace_bytes(m_pad, inter, n_in, sms) <=
                 grouped::fp8_padded_swiglu_workspace_bytes(kPaddedWorkspaceRows, 256, 128, sms),
             what, ": CUTLASS asks for a workspace that grows with the problem");
  grouped::run_fp8_padded_swiglu(q, scales, in, in_scales, w13, w13_scales, tile_expert, used_rows, m_pad, n_experts,
                                 n_in, inter, workspace, sms, device, stream);
}

template void moe_quantize_e4m3<__nv_bfloat16>(uint8_t*, float*, const __nv_bfloat16*, const int32_t*,
                                               const int32_t*, int64_t, int64_t, int64_t, bool, cudaStream_t);
template void moe_quantize_e4m3<__half>(uint8_t*, float*, const __half*, const int32_t*, const int32_t*, int64_t,
                                        int64_t, int64_t, bool, cudaStream_t);

}  // namespace lfm2::cuda
