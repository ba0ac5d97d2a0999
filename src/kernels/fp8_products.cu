// The FP8 decode products (kernels/cuda/fp8_ops.h): the permutation and the combine of
// moe_experts_decode around moe_decode_gemm_fp8.cuh's two products, and the dense projection as
// one "expert" holding every row.
#include <algorithm>
#include <cmath>

#include "common/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/fp8_tuning.h"
#include "kernels/cuda/moe_decode_gemm_fp8.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

namespace g8 = moe_gemm_fp8;
constexpr int64_t kAlign = 256;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int n_sms() { return compute_sms(current_device()); }

// KH warps along k: 2 (128-row units) or 8 (32-row units); XR token slots per pass; max_units
// bounds the grid.
template <typename T, bool kGateUp, int KH, int XR>
void launch_xr(g8::Args a, int64_t max_units, const Fp8DecodeTuning& tn, cudaStream_t stream) {
  a.widen = tn.widen;
  a.variant = tn.variant & 1;
  if (tn.variant & 2) a.l2_hints = 0;
  auto kernel = g8::moe_gemm_fp8_kernel<T, kGateUp, KH, XR>;
  constexpr int smem = g8::Shape<KH, XR>::kSmem;
  static_assert(smem <= g8::kSmemMax && g8::Shape<KH, XR>::kStages >= 4, "the pipeline's shared memory");
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem);
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(max_units, int64_t(n_sms())));
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(g8::kThreads), smem, stream, true, a);
  CUDA_CHECK_LAUNCH(kGateUp ? "moe_gemm_fp8_kernel (gate/up)" : "moe_gemm_fp8_kernel (down)");
}

// The token tile as tall as a unit's rows need (one pass), no taller: a short tile leaves room for
// more weight stages in flight (12 / 11 / 9 / 7 of 16 KB at 8 / 16 / 32 / 64 rows). rows: the rows
// a unit is expected to hold at most; the height only sets passes and stages, never an output's
// arithmetic.
template <typename T, bool kGateUp, int KH>
void launch(const g8::Args& a, int64_t max_units, int64_t rows, const Fp8DecodeTuning& tn, cudaStream_t stream) {
  if (tn.tile_rows > 0) rows = tn.tile_rows;
  if (rows <= 8)
    launch_xr<T, kGateUp, KH, 8>(a, max_units, tn, stream);
  else if (rows <= 16)
    launch_xr<T, kGateUp, KH, 16>(a, max_units, tn, stream);
  else if (rows <= 32)
    launch_xr<T, kGateUp, KH, 32>(a, max_units, tn, stream);
  else
    launch_xr<T, kGateUp, KH, 64>(a, max_units, tn, stream);
}

void check_shapes(const char* what, const void* in, const void* w, const void* w2, int64_t k, int64_t r) {
  LFM2_CHECK(k % 16 == 0 && r % 8 == 0 && aligned16(in) && aligned16(w) && (!w2 || aligned16(w2)), what,
             ": the sizes (", k, ", ", r, ") must be multiples of 16 and 8 and the buffers 16-byte aligned");
}

}  // namespace

int64_t moe_experts_decode_fp8_routed_scratch_bytes(int64_t n_tokens, int64_t hidden, int64_t inter, int64_t top_k,
                                                    int64_t elem_bytes) {
  const int64_t P = n_tokens * top_k;
  return align_up(P * inter * elem_bytes) + align_up(P * hidden * 4);
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
  // act (P, I) T, then y (P, H) fp32
  auto* act = static_cast<T*>(scratch);
  auto* y = reinterpret_cast<float*>(static_cast<char*>(scratch) + align_up(P * I * int64_t(sizeof(T))));
  const int blocks = scheme == Fp8Scheme::Block128;
  // an expert's rows: P / E on average; the tile covers the mean + 2.5 standard deviations of a
  // uniform router (a hotter expert takes a second pass over its weights), never more than n_tokens.
  // H100, one LFM2-8B-A1B layer, tiles forced (docs/fp8.md): 8 / 32 / 64 / 128 / 256 tokens are
  // fastest at 8 / 16 / 16 / 32 / 64 rows, which this picks
  const double mean = double(P) / double(E);
  const int64_t rows = std::min<int64_t>(n_tokens, int64_t(std::ceil(mean + 2.5 * std::sqrt(mean))));
  const int64_t touched = std::min(E, P);
  const g8::Args a{w13, s13, in, offsets, src_token, act, H, I, int(E), 0, blocks, g8::kOutT, 1};
  if (!(tn.variant & 4)) launch<T, true, 2>(a, touched * ((I + 63) / 64), rows, tn, stream);
  const g8::Args b{w2, s2, act, offsets, nullptr, y, I, H, int(E), 0, blocks, g8::kOutF32, 1};
  if (!(tn.variant & 8)) launch<T, false, 2>(b, touched * ((H + 127) / 128), rows, tn, stream);
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
  // moe_experts_decode's scratch layout: offsets, src_token, dest_row, then act and y
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
