// Hopper's warpgroup MMA (wgmma, sm_90a only) on tiles in shared memory, for the decode kernels'
// expert products: both operands K-major, 128-byte rows with their 16-byte chunks XOR-swizzled by
// row (chunk c of row r at c ^ (r & 7): the 128-byte swizzle), eight-row groups 1024 bytes apart,
// each tile starting on a 1024-byte boundary. The k steps inside a 128-byte row advance the start
// address by their byte offset (32 bytes a step: 16 bf16 / fp16 or 32 e4m3 k), as CUTLASS does.
//
// D (m64 x n64, fp32, 32 registers a thread): warp w of the warpgroup holds rows 16 w + g and
// 16 w + g + 8 (g = lane / 4, q = lane % 4); register 4 j + i holds column 8 j + 2 q + (i & 1) of
// row 16 w + g + 8 (i >> 1), as mma.sync's m16n8 accumulator for each n8 block j.
//
// Each output element is a dot product of its A row and B column alone: the other rows and columns
// (padding included) never enter it.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lfm2::cuda::wgmma {

// The shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle at `addr` (a
// shared-space address; the tile's base 1024-byte aligned, addr = base + the k step's byte offset).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);  // start address, 14 bits
  d |= uint64_t(1) << 16;                // leading byte offset: unused with a swizzle (1 by convention)
  d |= uint64_t(1024 >> 4) << 32;        // stride byte offset: eight rows of 128 bytes
  d |= uint64_t(1) << 62;                // layout: 128-byte swizzle
  return d;
}

// Orders this thread's generic-proxy writes to shared memory (cp.async, st.shared) before the
// async proxy's reads (wgmma) that follow a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The group instructions exist on sm_90a alone; elsewhere the kernels that call them trap (their
// launchers run them only on sm_90a builds).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LFM2_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define LFM2_WGMMA_ASM(...) __trap()
#endif
// Before the first wgmma of a group (accumulator registers written by other instructions).
__device__ __forceinline__ void fence() { LFM2_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { LFM2_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
  LFM2_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
__device__ __forceinline__ void fence_acc(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define LFM2_WGMMA_D32                                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define LFM2_WGMMA_D32_OUT(d)                                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (+)= A (64 x 16, descriptor a) . B (64 x 16, descriptor b)^T; accumulate 0 overwrites d.
template <typename T>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LFM2_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : LFM2_WGMMA_D32_OUT(d)
        : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " LFM2_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : LFM2_WGMMA_D32_OUT(d)
        : "l"(a), "l"(b), "r"(accumulate));
#else
  __trap();  // wgmma needs sm_90a
#endif
}

// d (+)= A (64 x 32 e4m3) . B (64 x 32 e4m3)^T in fp32; accumulate 0 overwrites d.
__device__ __forceinline__ void mma_m64n64k32_e4m3(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " LFM2_WGMMA_D32 ", %32, %33, p, 1, 1;\n}\n"
      : LFM2_WGMMA_D32_OUT(d)
      : "l"(a), "l"(b), "r"(accumulate));
#else
  __trap();
#endif
}

#undef LFM2_WGMMA_D32
#undef LFM2_WGMMA_D32_OUT
#undef LFM2_WGMMA_ASM

}  // namespace lfm2::cuda::wgmma
