// Linear layers on the GPU through cuBLASLt: out = in W^T with fp32 accumulation, row-major
// out (n_rows, n_out) computed as column-major out^T = W in^T. fp32 runs with CUBLAS_COMPUTE_32F
// (exact fp32, no TF32) unless tf32 is asked for; bf16 and fp16 run on the tensor cores.
//
// Pinned algorithms (deterministic per row): the algorithm of a product is chosen once per
// (device, types, n_in, n_out, epilogue) by cuBLASLt's heuristic at kPlanRows rows, with split-K
// excluded (reduction scheme NONE), and reused for every row count. Each output element is then
// one dot product in the same k order whatever the batch, so a sequence's bits do not depend on its
// microbatch. LFM2_GEMM_PIN=0 (or set_gemm_pinning(false)) asks the heuristic per row count
// instead (cuBLAS's usual behaviour; measured in docs/cuda-backend.md).
//
// linear_lt_at (cuda/linear_lt.h, for linear_decode.cu) pins a second algorithm per shape: the
// heuristic's pick at a given row count (no split-K either), used for every row count of a call.
//
// linear_add_f32 fuses the residual add into the product: x = 1 * (in W^T) + 1 * x, C = D = x (fp32),
// so the sublayer output never exists as a separate tensor.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common/cuda_check.h"
#include "common/env.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/lt_algo.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int64_t kPlanRows = 4096;  // the microbatch size the pinned algorithms are chosen for

template <typename T>
cudaDataType_t data_type();
template <>
cudaDataType_t data_type<float>() { return CUDA_R_32F; }
template <>
cudaDataType_t data_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <>
cudaDataType_t data_type<__half>() { return CUDA_R_16F; }

bool& pinning() {
  static bool on = env_choice("LFM2_GEMM_PIN", "1", {"0", "1"}) == "1";
  return on;
}

// One product's fixed part: the operation, the weight layout and the algorithm(s).
struct PlanKey {
  int device;
  cudaDataType_t ab, d;
  cublasComputeType_t compute;
  int64_t n_in, n_out;
  bool accumulate;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, ab, d, compute, n_in, n_out, accumulate) <
           std::tie(o.device, o.ab, o.d, o.compute, o.n_in, o.n_out, o.accumulate);
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // the weight: column-major (n_in, n_out), used transposed
  cublasLtMatmulAlgo_t pinned{};
  std::map<int64_t, cublasLtMatmulAlgo_t> per_rows;  // unpinned: the heuristic's choice per row count
};

// The heuristic's first algorithm without split-K for this shape (16-byte aligned buffers).
cublasLtMatmulAlgo_t choose(const PlanKey& k, const Plan& p, int64_t rows) {
  const LtLayouts l(k.ab, k.d, rows, k.n_in, k.n_out);
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  CUBLAS_CHECK(unsplit_algo(p.op, p.a, l, &algo, &found));
  LFM2_CHECK(found, "linear: cuBLASLt offers no algorithm without split-K for ", rows, " x ", k.n_in, " -> ",
             k.n_out);
  return algo;
}

std::mutex g_mutex;
std::map<PlanKey, Plan>& plans() {
  static std::map<PlanKey, Plan> m;  // never shrinks: Plan references stay valid
  return m;
}

Plan& plan_for(const PlanKey& k) {
  auto it = plans().find(k);
  if (it != plans().end()) return it->second;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, k.compute, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Fewer SMs than the device has when some are reserved for kernels running beside (device_info.h).
  const int32_t sms = compute_sms(k.device);
  if (sms < device_info(k.device).sm_count)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, k.ab, uint64_t(k.n_in), uint64_t(k.n_out), k.n_in));
  p.pinned = choose(k, p, kPlanRows);
  return plans().emplace(k, std::move(p)).first->second;
}

// plan_rows > 0: the algorithm chosen at plan_rows rows, whatever n_rows is; 0: pinned or per size.
template <typename T>
void gemm(void* out, cudaDataType_t out_type, const T* in, const T* weight, int64_t n_rows, int64_t n_in,
          int64_t n_out, cudaStream_t stream, bool tf32, bool accumulate, int64_t plan_rows = 0) {
  if (n_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_rows < (int64_t(1) << 31) && n_in < (int64_t(1) << 31) && n_out < (int64_t(1) << 31),
             "linear: sizes ", n_rows, "x", n_in, "x", n_out, " too large");
  for (const void* p : {static_cast<const void*>(in), static_cast<const void*>(weight), static_cast<const void*>(out)})
    LFM2_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "linear: buffers must be 16-byte aligned");
  PlanKey key{current_device(), data_type<T>(), out_type, CUBLAS_COMPUTE_32F, n_in, n_out, accumulate};
  if (std::is_same<T, float>::value && tf32) key.compute = CUBLAS_COMPUTE_32F_FAST_TF32;

  cublasLtMatmulAlgo_t algo;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    Plan& p = plan_for(key);
    op = p.op;
    a = p.a;
    if (plan_rows <= 0 && pinning()) {
      algo = p.pinned;
    } else {
      const int64_t at = plan_rows > 0 ? plan_rows : n_rows;
      auto it = p.per_rows.find(at);
      if (it == p.per_rows.end()) it = p.per_rows.emplace(at, choose(key, p, at)).first;
      algo = it->second;
    }
  }
  const LtLayouts l(key.ab, key.d, n_rows, n_in, n_out);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), op, &alpha, weight, a, in, l.b, &beta, out, l.d, out, l.d, &algo,
                              cublas_workspace(), kCublasWorkspaceBytes, stream));
  if (cuda_sync_check_enabled()) CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

void set_gemm_pinning(bool pinned) { pinning() = pinned; }
bool gemm_pinning() { return pinning(); }

template <typename T>
void linear(T* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out, cudaStream_t stream,
            bool tf32) {
  gemm<T>(out, data_type<T>(), in, weight, n_rows, n_in, n_out, stream, tf32, false);
}

template <typename T>
void linear_f32out(float* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream, bool tf32) {
  gemm<T>(out, CUDA_R_32F, in, weight, n_rows, n_in, n_out, stream, tf32, false);
}

template <typename T>
void linear_add_f32(float* x, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                    cudaStream_t stream, bool tf32) {
  gemm<T>(x, CUDA_R_32F, in, weight, n_rows, n_in, n_out, stream, tf32, true);
}

template <typename T>
void linear_lt_at(void* out, LtOut kind, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                  int64_t plan_rows, cudaStream_t stream) {
  LFM2_CHECK(plan_rows > 0, "linear_lt_at: plan rows ", plan_rows);
  const cudaDataType_t out_type = kind == LtOut::kT ? data_type<T>() : CUDA_R_32F;
  gemm<T>(out, out_type, in, weight, n_rows, n_in, n_out, stream, false, kind == LtOut::kAddF32, plan_rows);
}

#define INST(T)                                                                                                \
  template void linear_lt_at<T>(void*, LtOut, const T*, const T*, int64_t, int64_t, int64_t, int64_t,         \
                                cudaStream_t);                                                                 \
  template void linear<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);             \
  template void linear_f32out<T>(float*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);  \
  template void linear_add_f32<T>(float*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
