// What linear.cu and linear_fp8.cu share about cuBLASLt: the activation and output layouts of one
// call (column-major, out^T = W in^T) and the choice of a pinned algorithm (the heuristic's first
// that does not split k, so a row's bits never depend on the row count). Host code.
#pragma once

#include <cstdint>

#include <cublasLt.h>

#include "common/cuda_check.h"
#include "kernels/cuda/cublas_ctx.h"

namespace lfm2::cuda {

// B: the activations (n_in, rows) of type ab; D: the output (n_out, rows) of type dt.
struct LtLayouts {
  cublasLtMatrixLayout_t b = nullptr, d = nullptr;
  LtLayouts(cudaDataType_t ab, cudaDataType_t dt, int64_t rows, int64_t n_in, int64_t n_out) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, ab, uint64_t(n_in), uint64_t(rows), n_in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, dt, uint64_t(n_out), uint64_t(rows), n_out));
  }
  ~LtLayouts() {
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
  LtLayouts(const LtLayouts&) = delete;
  LtLayouts& operator=(const LtLayouts&) = delete;
};

// The heuristic's first algorithm without split-K for op with weight layout a on l (C = D; 16-byte
// aligned buffers, kCublasWorkspaceBytes) into *algo. Returns the heuristic's status; *found says
// whether one was offered.
inline cublasStatus_t unsplit_algo(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, const LtLayouts& l,
                                   cublasLtMatmulAlgo_t* algo, bool* found) {
  *found = false;
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kCublasWorkspaceBytes;
  const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE, align = 16;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_reduction,
                                                    sizeof(no_reduction)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  constexpr int kWant = 8;
  cublasLtMatmulHeuristicResult_t res[kWant];
  int n = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), op, a, l.b, l.d, l.d, pref, kWant, res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  for (int i = 0; i < n && !*found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    int32_t splitk = 1;
    size_t written = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                      sizeof(splitk), &written));
    if (splitk <= 1) *algo = res[i].algo, *found = true;
  }
  return st;
}

}  // namespace lfm2::cuda
