// Grouped GEMM over the experts of an MoE layer, with the per-expert row counts read on the device
// (no host round trip): out[r] = in[r] W_e^T for r in expert e's rows [offsets[e], offsets[e+1]),
// and the gather that puts the token rows into that expert order first.
//
//  - bf16 / fp16: CUTLASS's sm90 ptr-array grouped GEMM (grouped_gemm_sm90.h: TMA, wgmma, problem
//    shapes written on the device), tile configuration from one table by the mean rows per expert.
//  - fp32: a tiled SIMT kernel, exact fp32 FMAs (CUTLASS's sm90 ptr-array kernels are tensor-core
//    only, and fp32 stays exact: no TF32). 128 x 128 x 8 tiles, 8 x 8 outputs per thread; the grid
//    covers the worst case (ceil(max_rows / 128) + n_experts row tiles) and a block finds its
//    (expert, row tile) from the offsets, exiting when past the last tile.
// Each output element is one dot product in a fixed k order, without split-K, so a row's result
// does not depend on how many rows share the product: bit-identical for any microbatch.
#include <cstdlib>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/env.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

// ---------------------------------------------------------------- gather
// out[r] = in[src[r]], rows of `units` elements of U (16-byte vectors where the rows allow).
template <typename U>
__global__ void gather_kernel(U* out, const U* in, const int32_t* src, int64_t n_rows, int64_t units) {
  const int64_t n = n_rows * units;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / units, c = i - r * units;
    out[i] = in[int64_t(src[r]) * units + c];
  }
}

// ---------------------------------------------------------------- SIMT fp32
// Finds the block's (expert, first row, end row) from the offsets; e = -1 when past the last tile.
// Warp 0 scans the experts' tile counts 32 at a time (coalesced loads, a shuffle scan).
template <int BM>
__device__ __forceinline__ void find_tile(const int32_t* offsets, int n_experts, int* s_info) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, t = blockIdx.y;
    if (lane == 0) s_info[0] = -1;
    __syncwarp();
    int running = 0;
    for (int base = 0; base < n_experts; base += 32) {
      const int x = base + lane;
      int b = 0, c = 0, nt = 0;
      if (x < n_experts) {
        b = offsets[x];
        c = offsets[x + 1] - b;
        nt = (c + BM - 1) / BM;
      }
      int incl = nt;
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int excl = incl - nt;
      const bool mine = nt > 0 && t >= running + excl && t < running + incl;
      if (mine) {
        s_info[0] = x;
        s_info[1] = b + (t - running - excl) * BM;
        s_info[2] = b + c;
      }
      running += __shfl_sync(0xffffffffu, incl, 31);
      if (__ballot_sync(0xffffffffu, mine)) break;
    }
  }
  __syncthreads();
}

// 128 x 128 x 8 tiles, 256 threads of 8 x 8 outputs (rows ty*4 + {0..3} and 64 + ty*4 + {0..3},
// columns likewise with tx), tiles staged k-major in shared memory with the next tile's global
// loads held in registers during the current tile's FMAs. kVec: float4 loads (n_in % 4 == 0).
namespace simt {
constexpr int BM = 128, BN = 128, BK = 8, kThreads = 256, LDS = BM + 4;
}

// A thread's 8 x 8 outputs of the tile (rows ty * 4 .. and 64 + ty * 4 .., columns likewise with tx)
// into out's rows row0 .. row_end - 1 and columns n0 .. N - 1.
__device__ __forceinline__ void store_tile(float* out, const float (&acc)[8][8], int row0, int row_end, int n0, int N,
                                           int ty, int tx) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = row0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
    if (r >= row_end) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (c < N) out[int64_t(r) * N + c] = acc[i][j];
    }
  }
}

template <bool kVec>
__global__ void __launch_bounds__(simt::kThreads)
    grouped_simt_kernel(float* out, const float* in, const float* weight, const int32_t* offsets, int n_experts, int N,
                        int K) {
  using namespace simt;
  __shared__ __align__(16) float sa[2][BK][LDS];
  __shared__ __align__(16) float sb[2][BK][LDS];
  __shared__ int s_info[3];

  find_tile<BM>(offsets, n_experts, s_info);
  const int e = s_info[0];
  if (e < 0) return;
  const int row0 = s_info[1], row_end = s_info[2];
  const int n0 = blockIdx.x * BN;
  const int tid = threadIdx.x;
  const float* w = weight + int64_t(e) * N * K;

  // Each thread loads 4 consecutive k of one A row and one B row per tile: row lr, k lk .. lk+3.
  const int lr = tid >> 1, lk = (tid & 1) * 4;
  const float* a_row = row0 + lr < row_end ? in + int64_t(row0 + lr) * K : nullptr;
  const float* b_row = n0 + lr < N ? w + int64_t(n0 + lr) * K : nullptr;
  float ra[4], rb[4];
  auto fetch = [&](int k0) {
    const int k = k0 + lk;
    if (kVec) {
      const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 va = (a_row && k < K) ? *reinterpret_cast<const float4*>(a_row + k) : z;
      const float4 vb = (b_row && k < K) ? *reinterpret_cast<const float4*>(b_row + k) : z;
      ra[0] = va.x, ra[1] = va.y, ra[2] = va.z, ra[3] = va.w;
      rb[0] = vb.x, rb[1] = vb.y, rb[2] = vb.z, rb[3] = vb.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        ra[j] = (a_row && k + j < K) ? a_row[k + j] : 0.f;
        rb[j] = (b_row && k + j < K) ? b_row[k + j] : 0.f;
      }
    }
  };
  auto stash = [&](int st) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sa[st][lk + j][lr] = ra[j];
      sb[st][lk + j][lr] = rb[j];
    }
  };

  const int ty = tid >> 4, tx = tid & 15;
  float acc[8][8] = {};
  const int nk = (K + BK - 1) / BK;
  fetch(0);
  stash(0);
  __syncthreads();
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt & 1;
    if (kt + 1 < nk) fetch((kt + 1) * BK);
#pragma unroll
    for (int kc = 0; kc < BK; ++kc) {
      float a[8], b[8];
      const float4 a0 = *reinterpret_cast<const float4*>(&sa[st][kc][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&sa[st][kc][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&sb[st][kc][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&sb[st][kc][64 + tx * 4]);
      a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w, a[4] = a1.x, a[5] = a1.y, a[6] = a1.z, a[7] = a1.w;
      b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w, b[4] = b1.x, b[5] = b1.y, b[6] = b1.z, b[7] = b1.w;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (kt + 1 < nk) stash(st ^ 1);  // the other buffer was last read before the previous barrier
    __syncthreads();
  }
  store_tile(out, acc, row0, row_end, n0, N, ty, tx);
}

// The tile configuration forced for tuning and tests (-1: the table). LFM2_GROUPED_CONFIG sets
// its initial value; grouped::force_config() changes it.
int& forced_config() {
  static int c = int(env_whole("LFM2_GROUPED_CONFIG", -1, -1, grouped::kGroupedConfigCount - 1));
  return c;
}

// The checks every bf16/fp16 grouped product makes; returns the device.
int check_sixteen_bit(const void* in, const void* weight, const void* out, int64_t n_in, int64_t n_out,
                      const void* workspace, const char* what) {
  const int device = current_device();
  const DeviceInfo& info = device_info(device);
  LFM2_CHECK(info.sm90a(), what, ": the bf16/fp16 grouped GEMM is built for Hopper (sm_90a); ",
             "device ", device, " is sm_", info.major, info.minor);
  LFM2_CHECK(n_in % 8 == 0 && n_out % 8 == 0 && aligned16(in) && aligned16(weight) && aligned16(out), what,
             ": bf16/fp16 needs 16-byte rows and pointers (n_in ", n_in, ", n_out ", n_out, " multiples of 8)");
  LFM2_CHECK(workspace != nullptr && aligned16(workspace), what, ": no workspace");
  return device;
}

}  // namespace

namespace grouped {

void force_config(int config) {
  LFM2_CHECK(config >= -1 && config < kGroupedConfigCount, "grouped GEMM: no tile configuration ", config);
  forced_config() = config;
}

int pick_config(int64_t max_rows, int64_t n_experts) {
  if (forced_config() >= 0) return forced_config();
  const int64_t mean = max_rows / std::max<int64_t>(n_experts, 1);
  for (const TileChoice& c : kGroupedChoice)
    if (mean < c.mean_rows_below) return c.config;
  return kGroupedChoice[0].config;
}

}  // namespace grouped

template <typename T>
void moe_gather(T* out, const T* in, const int32_t* src_token, int64_t n_rows, int64_t hidden, cudaStream_t stream) {
  if (n_rows == 0 || hidden == 0) return;
  constexpr int64_t kVec = 16 / sizeof(T);
  if (hidden % kVec == 0 && aligned16(out) && aligned16(in)) {
    const int64_t units = hidden / kVec;
    gather_kernel<uint4><<<grid_for(n_rows * units, 256 * 4), 256, 0, stream>>>(
        reinterpret_cast<uint4*>(out), reinterpret_cast<const uint4*>(in), src_token, n_rows, units);
  } else {
    gather_kernel<T><<<grid_for(n_rows * hidden, 256 * 4), 256, 0, stream>>>(out, in, src_token, n_rows, hidden);
  }
  CUDA_CHECK_LAUNCH("moe_gather gather_kernel");
}

int64_t moe_grouped_matmul_workspace_bytes(int64_t n_experts) {
  return int64_t(grouped::workspace_bytes(n_experts, compute_sms(current_device())));
}

template <typename T>
void moe_grouped_matmul(T* out, const T* in, const T* weight, const int32_t* offsets, int64_t max_rows,
                        int64_t n_experts, int64_t n_in, int64_t n_out, void* workspace, cudaStream_t stream) {
  if (max_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_experts >= 1 && n_in >= 1 && n_in < (int64_t(1) << 31) && n_out < (int64_t(1) << 31) &&
                 max_rows < (int64_t(1) << 31),
             "moe_grouped_matmul: sizes ", max_rows, " rows, ", n_experts, " experts, ", n_in, " -> ", n_out);
  if constexpr (std::is_same<T, float>::value) {
    using namespace simt;
    const int64_t tiles = (max_rows + BM - 1) / BM + n_experts;
    LFM2_CHECK(tiles < 65536, "moe_grouped_matmul: ", tiles, " row tiles exceed one launch");
    const dim3 grid(unsigned((n_out + BN - 1) / BN), unsigned(tiles));
    if (n_in % 4 == 0 && aligned16(in) && aligned16(weight))
      grouped_simt_kernel<true><<<grid, kThreads, 0, stream>>>(out, in, weight, offsets, int(n_experts), int(n_out),
                                                               int(n_in));
    else
      grouped_simt_kernel<false><<<grid, kThreads, 0, stream>>>(out, in, weight, offsets, int(n_experts),
                                                                int(n_out), int(n_in));
    CUDA_CHECK_LAUNCH("grouped_simt_kernel");
  } else {
    const int device = check_sixteen_bit(in, weight, out, n_in, n_out, workspace, "moe_grouped_matmul");
    grouped::run<T>(grouped::pick_config(max_rows, n_experts), out, in, weight, offsets, n_experts, n_in, n_out,
                    workspace, compute_sms(device), device, stream);
  }
}

template <typename T>
void moe_grouped_swiglu(T* act, const T* in, const T* w13, const int32_t* offsets, int64_t max_rows,
                        int64_t n_experts, int64_t n_in, int64_t inter, void* workspace, cudaStream_t stream) {
  static_assert(!std::is_same<T, float>::value, "fp32 runs the SIMT product and swiglu_pairs");
  if (max_rows == 0 || inter == 0) return;
  LFM2_CHECK(n_experts >= 1 && n_in < (int64_t(1) << 31) && 2 * inter < (int64_t(1) << 31) &&
                 max_rows < (int64_t(1) << 31),
             "moe_grouped_swiglu: sizes ", max_rows, " rows, ", n_experts, " experts, ", n_in, " -> 2 x ", inter);
  const int device = check_sixteen_bit(in, w13, act, n_in, 2 * inter, workspace, "moe_grouped_swiglu");
  LFM2_CHECK(inter % 8 == 0, "moe_grouped_swiglu: inter ", inter, " must be a multiple of 8");
  // the fused epilogue exists for the table's configurations; a forced other one falls back to the first
  int config = grouped::pick_config(max_rows, n_experts);
  if (config != 0 && config != 1) config = 0;
  grouped::run_swiglu<T>(config, act, in, w13, offsets, n_experts, n_in, inter, workspace,
                         compute_sms(device), device, stream);
}

#define INST(T)                                                                                              \
  template void moe_gather<T>(T*, const T*, const int32_t*, int64_t, int64_t, cudaStream_t);                \
  template void moe_grouped_matmul<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                      void*, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST
#define INST(T)                                                                                              \
  template void moe_grouped_swiglu<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                      void*, cudaStream_t);
INST(__nv_bfloat16)
INST(__half)
#undef INST

}  // namespace lfm2::cuda
