// One cuBLASLt handle per device for the whole process, with one fixed workspace, so that a matrix
// product never allocates. cublas_prepare() creates them up front (call it while allocating a
// stage's buffers); cublaslt_handle() / cublas_workspace() return them for the current device.
// The decode products (linear_decode.cu) keep their split-K partials and tile counters in a second
// fixed workspace per device, made at the same time; the decode router (moe_route_decode) its
// block counter, the decode expert products (moe_decode_gemm.cuh) their unit counters. All are
// shared by every product on the device, so products that use them run in one stream order (a
// stage has one compute stream).
#pragma once

#include <cstddef>

#include <cublasLt.h>

namespace lfm2::cuda {

void cublas_prepare();                 // for the current device; idempotent
cublasLtHandle_t cublaslt_handle();    // for the current device (prepares it on first use)
void* cublas_workspace();              // the device's workspace, kCublasWorkspaceBytes
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

// The decode products' workspace: fp32 partial tiles, and counters that are zero between calls
// (each call's last block of a tile resets its counter).
struct DecodeWorkspace {
  float* partial = nullptr;
  int64_t partial_bytes = 0;
  int* counters = nullptr;
  int64_t n_counters = 0;
  int* route_counter = nullptr;  // moe_route_decode's (past the n_counters of the products)
  int* moe_unit_counters = nullptr;  // the decode expert products' 4 (gate/up's pair, down's), past them too
  int* moe_ready = nullptr;  // the fused products' gate/up units per expert (kMoeReady), before the 5 above
};
DecodeWorkspace decode_gemm_workspace();  // for the current device (prepares it on first use)
inline constexpr size_t kDecodeWorkspaceBytes = size_t(32) << 20;  // 256 rows x 32768 outputs x fp32
inline constexpr int64_t kDecodeCounters = 16384;
inline constexpr int64_t kMoeReady = 1024;  // moe_gemm::kMaxExperts

}  // namespace lfm2::cuda
