// cuBLASLt's FP8 matmul for the prompt rows' projections of a --dense FP8 file (cuda/linear_fp8_lt.h):
// out^T (n_out, n_rows) = W in^T column-major as linear.cu, A = the weight (e4m3, transposed), B =
// the activations (e4m3), C = D = out (T, or fp32 with beta 1 for the residual add). The scale
// pointers are the descriptor's attributes, set per call under the plans' lock.
#include <map>
#include <mutex>
#include <tuple>

#include "common/cuda_check.h"
#include "common/error.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/linear_fp8_lt.h"
#include "kernels/cuda/lt_algo.h"

namespace lfm2::cuda {
namespace {

constexpr int64_t kPlanRows = 4096;  // as linear.cu: the algorithm picked at this many rows, for all

template <typename T>
cudaDataType_t t_type();
template <>
cudaDataType_t t_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <>
cudaDataType_t t_type<__half>() { return CUDA_R_16F; }

struct Key {
  int device;
  cudaDataType_t d;
  int64_t n_in, n_out;
  bool accumulate, channel;
  bool operator<(const Key& o) const {
    return std::tie(device, d, n_in, n_out, accumulate, channel) <
           std::tie(o.device, o.d, o.n_in, o.n_out, o.accumulate, o.channel);
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The heuristic's first algorithm without split-K at kPlanRows rows.
cublasLtMatmulAlgo_t choose(const Key& k, const Plan& p) {
  const LtLayouts l(CUDA_R_8F_E4M3, k.d, kPlanRows, k.n_in, k.n_out);
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  const cublasStatus_t st = unsplit_algo(p.op, p.a, l, &algo, &found);
  LFM2_CHECK(st == CUBLAS_STATUS_SUCCESS, "linear_fp8_lt: cuBLASLt refuses e4m3 ", k.channel ? "channel" : "block128",
             " scales for ", k.n_in, " -> ", k.n_out, (k.accumulate ? " (+= fp32)" : ""), ": ",
             cublasGetStatusString(st));
  LFM2_CHECK(found, "linear_fp8_lt: cuBLASLt offers no algorithm without split-K for ", k.n_in, " -> ", k.n_out);
  return algo;
}

std::mutex g_mutex;
std::map<Key, Plan>& plans() {
  static std::map<Key, Plan> m;
  return m;
}

// The scale pointers are set before the heuristic is asked: cuBLASLt refuses a non-scalar scale mode
// without one (CUBLAS_STATUS_INVALID_VALUE; H100, DN8 call 1).
Plan& plan_for(const Key& k, const float* a_scales, const float* b_scales) {
  auto it = plans().find(k);
  if (it != plans().end()) return it->second;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const int32_t a_mode =
      k.channel ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode =
      k.channel ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  const int32_t sms = compute_sms(k.device);
  if (sms < device_info(k.device).sm_count)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(k.n_in), uint64_t(k.n_out), k.n_in));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof(a_scales)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales, sizeof(b_scales)));
  p.algo = choose(k, p);
  return plans().emplace(k, p).first->second;
}

__global__ void set_offsets_kernel(int32_t* offsets, int32_t n_rows) {
  offsets[0] = 0;
  offsets[1] = n_rows;
}

}  // namespace

template <typename T>
void linear_fp8_lt(void* out, LtOut kind, const uint8_t* in, const float* in_scales, const uint8_t* w,
                   const float* w_scales, Fp8Scheme scheme, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  const bool channel = scheme == Fp8Scheme::Channel;
  LFM2_CHECK(n_in % 128 == 0 && (channel || n_out % 128 == 0) && n_out % 16 == 0 && n_rows < (int64_t(1) << 31) &&
                 n_in < (int64_t(1) << 31) && n_out < (int64_t(1) << 31),
             "linear_fp8_lt: ", n_rows, " x ", n_in, " -> ", n_out, " (n_in a multiple of 128",
             channel ? "" : ", n_out too", ")");
  LFM2_CHECK(aligned16(out) && aligned16(in) && aligned16(w) && aligned16(in_scales) && aligned16(w_scales),
             "linear_fp8_lt: buffers must be 16-byte aligned");
  const cudaDataType_t dt = kind == LtOut::kT ? t_type<T>() : CUDA_R_32F;
  const Key key{current_device(), dt, n_in, n_out, kind == LtOut::kAddF32, channel};
  const LtLayouts l(CUDA_R_8F_E4M3, dt, n_rows, n_in, n_out);
  const float alpha = 1.f, beta = kind == LtOut::kAddF32 ? 1.f : 0.f;
  std::lock_guard<std::mutex> lock(g_mutex);  // the scale pointers live in the shared descriptor
  Plan& p = plan_for(key, w_scales, in_scales);
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &in_scales, sizeof(in_scales)));
  const cublasStatus_t st = cublasLtMatmul(cublaslt_handle(), p.op, &alpha, w, p.a, in, l.b, &beta, out, l.d, out,
                                           l.d, &p.algo, cublas_workspace(), kCublasWorkspaceBytes, stream);
  // H100, CUDA 13.0 (DN8 call 2): the block128 algorithm picked at 4,096 rows refuses 1 row and some
  // ragged counts (CUBLAS_STATUS_NOT_SUPPORTED); channel ran at every count tried
  LFM2_CHECK(st != CUBLAS_STATUS_NOT_SUPPORTED, "linear_fp8_lt: cuBLASLt's FP8 matmul (",
             channel ? "channel" : "block128", " scales) refuses ", n_rows, " rows of ", n_in, " -> ", n_out,
             "; LFM2_FP8_PROJ=0 runs this file's projections dequantized");
  CUBLAS_CHECK(st);
  if (cuda_sync_check_enabled()) CUDA_CHECK(cudaDeviceSynchronize());
}

template <typename T>
void quantize_rows_fp8_lt(uint8_t* q, float* scales, int32_t* offsets, const T* x, Fp8Scheme scheme, int64_t n_rows,
                          int64_t cols, cudaStream_t stream) {
  if (n_rows == 0) return;
  LFM2_CHECK(n_rows < (int64_t(1) << 31), "quantize_rows_fp8_lt: ", n_rows, " rows");
  set_offsets_kernel<<<1, 1, 0, stream>>>(offsets, int32_t(n_rows));
  CUDA_CHECK_LAUNCH("set_offsets_kernel");
  moe_quantize_e4m3(q, scales, x, nullptr, offsets, n_rows, 1, cols, scheme == Fp8Scheme::Channel, stream);
}

namespace {

// linear_fp8's scratch, carved for one call's dims (each part no larger than for larger dims).
struct FpScratch {
  uint8_t *q, *tail_q;           // (n_rows, n_in), (Q, n_in) e4m3
  float *s, *tail_s, *tail_tmp;  // (n_in / 128, n_rows), (n_in / 128, Q), (n_in / 128, rem) scales
  int32_t* offsets;              // {0, main}, {0, rem}
  char* tail_out;                // (Q, n_out) T or fp32
  int64_t bytes;
};

int64_t up256(int64_t b) { return (b + 255) / 256 * 256; }

FpScratch carve(char* base, int64_t n_rows, int64_t n_in, int64_t n_out) {
  const int64_t Q = kFp8LtRowQuantum, G = n_in / kFp8Block;
  FpScratch f{};
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    char* p = base ? base + at : nullptr;
    at += up256(bytes);
    return p;
  };
  f.q = reinterpret_cast<uint8_t*>(take(n_rows * n_in));
  f.s = reinterpret_cast<float*>(take(G * n_rows * 4));
  f.offsets = reinterpret_cast<int32_t*>(take(16));
  f.tail_q = reinterpret_cast<uint8_t*>(take(Q * n_in));
  f.tail_s = reinterpret_cast<float*>(take(G * Q * 4));
  f.tail_tmp = reinterpret_cast<float*>(take(G * Q * 4));
  f.tail_out = take(Q * n_out * 4);
  f.bytes = at;
  return f;
}

}  // namespace

int64_t linear_fp8_scratch_bytes(int64_t n_rows, int64_t n_in, int64_t n_out) {
  return carve(nullptr, n_rows, n_in, n_out).bytes;
}

namespace {

// The last rem < Q rows of a block128 projection through Q rows of scratch: their codes (at q, rows
// of n_in) and scales (the one of 128 columns g at s[g * s_ld]) into f.tail_q / f.tail_s (ld Q), zero
// rows after them; kAddF32 copies the residual's rows in first.
template <typename T>
void run_tail(void* out_tail, LtOut kind, const FpScratch& f, const uint8_t* q, const float* s, int64_t s_ld,
              const uint8_t* w, const float* w_scales, Fp8Scheme scheme, int64_t rem, int64_t n_in, int64_t n_out,
              cudaStream_t stream) {
  const int64_t Q = kFp8LtRowQuantum, G = n_in / kFp8Block, out_elem = kind == LtOut::kT ? int64_t(sizeof(T)) : 4;
  if (q != f.tail_q)
    CUDA_CHECK(cudaMemcpyAsync(f.tail_q, q, size_t(rem * n_in), cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaMemsetAsync(f.tail_q + rem * n_in, 0, size_t((Q - rem) * n_in), stream));
  CUDA_CHECK(cudaMemsetAsync(f.tail_s, 0, size_t(G * Q * 4), stream));
  CUDA_CHECK(cudaMemcpy2DAsync(f.tail_s, size_t(Q * 4), s, size_t(s_ld * 4), size_t(rem * 4), size_t(G),
                               cudaMemcpyDeviceToDevice, stream));
  if (kind == LtOut::kAddF32)
    CUDA_CHECK(cudaMemcpyAsync(f.tail_out, out_tail, size_t(rem * n_out * 4), cudaMemcpyDeviceToDevice, stream));
  linear_fp8_lt<T>(f.tail_out, kind, f.tail_q, f.tail_s, w, w_scales, scheme, Q, n_in, n_out, stream);
  CUDA_CHECK(cudaMemcpyAsync(out_tail, f.tail_out, size_t(rem * n_out * out_elem), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

// block128: the first `main` rows (a multiple of Q) straight into out, the last rem < Q through
// Q rows of scratch (zero rows after the real ones); channel takes every count (DN8 call 2).
template <typename T>
void linear_fp8(void* out, LtOut kind, const T* in, const uint8_t* w, const float* w_scales, Fp8Scheme scheme,
                int64_t n_rows, int64_t n_in, int64_t n_out, void* scratch, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_in % kFp8Block == 0 && reinterpret_cast<uintptr_t>(scratch) % 256 == 0,
             "linear_fp8: n_in ", n_in, " (a multiple of 128) and a 256-byte aligned scratch");
  const int64_t Q = kFp8LtRowQuantum;
  const int64_t rem = scheme == Fp8Scheme::Channel ? 0 : n_rows % Q, main = n_rows - rem;
  const int64_t out_elem = kind == LtOut::kT ? int64_t(sizeof(T)) : 4;
  const FpScratch f = carve(static_cast<char*>(scratch), n_rows, n_in, n_out);
  if (main) {
    quantize_rows_fp8_lt<T>(f.q, f.s, f.offsets, in, scheme, main, n_in, stream);
    linear_fp8_lt<T>(out, kind, f.q, f.s, w, w_scales, scheme, main, n_in, n_out, stream);
  }
  if (!rem) return;
  quantize_rows_fp8_lt<T>(f.tail_q, f.tail_tmp, f.offsets + 2, in + main * n_in, scheme, rem, n_in, stream);
  run_tail<T>(static_cast<char*>(out) + main * n_out * out_elem, kind, f, f.tail_q, f.tail_tmp, rem, w, w_scales,
              scheme, rem, n_in, n_out, stream);
  if (cuda_sync_check_enabled()) CUDA_CHECK(cudaDeviceSynchronize());
}

// As linear_fp8 on rows quantized before (rmsnorm_quantize_e4m3): block128's scales repacked to the
// main rows' leading dimension where the rows do not fill q_ld, the tail's codes and scales copied
// into its padded scratch.
template <typename T>
void linear_fp8_quantized(void* out, LtOut kind, const uint8_t* q, const float* q_scales, int64_t q_ld,
                          const uint8_t* w, const float* w_scales, Fp8Scheme scheme, int64_t n_rows, int64_t n_in,
                          int64_t n_out, void* scratch, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_in % kFp8Block == 0 && reinterpret_cast<uintptr_t>(scratch) % 256 == 0 && q_ld >= n_rows,
             "linear_fp8_quantized: n_in ", n_in, " (a multiple of 128), a 256-byte aligned scratch and ", q_ld,
             " >= ", n_rows, " rows of scales");
  const bool channel = scheme == Fp8Scheme::Channel;
  const int64_t Q = kFp8LtRowQuantum, G = n_in / kFp8Block;
  const int64_t rem = channel ? 0 : n_rows % Q, main = n_rows - rem;
  const int64_t out_elem = kind == LtOut::kT ? int64_t(sizeof(T)) : 4;
  const FpScratch f = carve(static_cast<char*>(scratch), n_rows, n_in, n_out);
  if (main) {
    const float* s = q_scales;  // channel: OUTER_VEC reads group 0's n_rows scales only
    if (!channel && q_ld != main) {
      CUDA_CHECK(cudaMemcpy2DAsync(f.s, size_t(main * 4), q_scales, size_t(q_ld * 4), size_t(main * 4), size_t(G),
                                   cudaMemcpyDeviceToDevice, stream));
      s = f.s;
    }
    linear_fp8_lt<T>(out, kind, q, s, w, w_scales, scheme, main, n_in, n_out, stream);
  }
  if (!rem) return;
  run_tail<T>(static_cast<char*>(out) + main * n_out * out_elem, kind, f, q + main * n_in, q_scales + main, q_ld, w,
              w_scales, scheme, rem, n_in, n_out, stream);
  if (cuda_sync_check_enabled()) CUDA_CHECK(cudaDeviceSynchronize());
}

#define INST(T)                                                                                                   \
  template void linear_fp8_lt<T>(void*, LtOut, const uint8_t*, const float*, const uint8_t*, const float*,        \
                                 Fp8Scheme, int64_t, int64_t, int64_t, cudaStream_t);                             \
  template void quantize_rows_fp8_lt<T>(uint8_t*, float*, int32_t*, const T*, Fp8Scheme, int64_t, int64_t,        \
                                        cudaStream_t);                                            \
  template void linear_fp8<T>(void*, LtOut, const T*, const uint8_t*, const float*, Fp8Scheme, int64_t, int64_t,  \
                              int64_t, void*, cudaStream_t);                                                      \
  template void linear_fp8_quantized<T>(void*, LtOut, const uint8_t*, const float*, int64_t, const uint8_t*,      \
                                        const float*, Fp8Scheme, int64_t, int64_t, int64_t, void*, cudaStream_t);
INST(__nv_bfloat16)
INST(__half)
#undef INST

}  // namespace lfm2::cuda
