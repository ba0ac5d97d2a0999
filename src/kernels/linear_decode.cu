// The projections at decode sizes (1..256 rows and more): out = in W^T for decode rows, by one path
// per shape fixed by (n_in, n_out) alone (decode_gemm_path: a table measured on the H100), so a
// row's bits depend on the shape only, never on the row count or the other rows:
//   kLt: cuBLASLt with the algorithm its heuristic picks at plan_rows rows, without split-K, pinned
//        for every row count (cuda/linear_lt.h; plan_rows 4096 is `linear`'s own pinned algorithm)
//   kKernel: the swap-AB kernel below
// linear_decode writes T, linear_f32out_decode fp32 (router logits, LM head), linear_add_f32_decode
// adds into the fp32 residual (x = x + in W^T). fp32 runs `linear` (pinned cuBLASLt).
//
// The kernel: gemv_mma.cuh's swap-AB warp tiles (32 weight rows x 8 NT tokens per warp), bf16 /
// fp16 in, fp32 accumulate, the weight read once. Split-K, fixed by the shape: a weight of few rows
// (out_proj, w2: 2048 rows, 16 blocks of 128) cannot keep 132 SMs streaming, so its k range is cut
// into `splits` slices of whole 64-k blocks, chosen from (n_in, n_out) alone. Each block writes its
// fp32 partial tile to a workspace in its threads' fragment order; the last block of a tile to
// arrive (a counter per tile, reset by that block) adds the slices in ascending order, p0 + p1 + ...,
// and runs the epilogue. So an element is always the same sum of the same slices.
// Blocks of 4 warps, 32 weight rows each, over 8 NT tokens staged in shared memory (gemv_mma.cuh's
// block_gemm); more than 64 rows run as passes of 64 tokens (NT and the passes change speed, not
// bits). Calls of more than 256 rows run in chunks of 256 (the workspace holds 256 rows).
// Measured (H100, bf16; cuda_bench_decode): near the floor only for wide outputs at few rows (LM
// head 2048 -> 65536: 89 % of the copy-bandwidth floor at 8 rows, 87 % at 32, ahead of cuBLASLt;
// dense w2 7168 -> 2048 at <= 32 rows: 0.046 ms vs 0.069 pinned); the 2048/3072/6144-row
// projections stay latency-bound (few warps, one 64-k block in flight each: 0.015-0.03 ms where
// cuBLASLt's per-size pick takes 0.007-0.008), and above 64 rows the passes fall behind cuBLASLt.
#include <algorithm>
#include <type_traits>

#include "common/cuda_check.h"
#include "kernels/cuda/cublas_ctx.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxSplits = 8;
constexpr int64_t kChunkRows = 256;  // rows per launch (the workspace's token capacity)
constexpr int64_t kTargetBlocks = 264;  // two blocks per SM of an H100 (a constant: splits never vary by GPU)
constexpr int64_t kMinSlice = 512;    // k per slice at least (two staged chunks)

enum Epi { kStoreT = 0, kStoreF32 = 1, kAddF32 = 2 };

// Block (pass, s, rb): warp w owns the 32 rows from (4 rb + w) 32; the block's tokens are the 8 NT
// from pass 8 NT, staged in shared memory; k slice s.
template <typename T, int NT, int kEpi>
__global__ void __launch_bounds__(kThreads) linear_decode_kernel(void* out, const T* in, const T* weight, int n_rows,
                                                                 int64_t n_in, int64_t n_out, int64_t k_slice,
                                                                 int splits, float* partial, int* counters) {
  constexpr int TB = 8 * NT, kElems = 2 * NT * 4;
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_x = reinterpret_cast<T*>(smem);
  const T** s_rows = reinterpret_cast<const T**>(smem + 2 * TB * gemv::kStageRow * sizeof(T));
  const int pass = blockIdx.x, s = blockIdx.y, rb = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const int64_t r0 = (int64_t(rb) * kWarps + warp) * 32;
  const int tok0 = pass * TB;
  const int nt = min(NT, (n_rows - tok0 + 7) / 8);
  for (int i = threadIdx.x; i < TB; i += kThreads) s_rows[i] = tok0 + i < n_rows ? in + int64_t(tok0 + i) * n_in : nullptr;
  __syncthreads();

  const T* w[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = r0 + 16 * m + g + 8 * r;
      w[m][r] = row < n_out ? weight + row * n_in : nullptr;
    }
  float acc[2][NT][4] = {};
  const int64_t k0 = int64_t(s) * k_slice, k1 = min(n_in, k0 + k_slice);
  gemv::block_gemm<T, 2, NT, TB, false>(acc, w, r0 < n_out, 0, nt, s_rows, s_x, in, k0, k1);

  if (splits > 1) {
    __shared__ int last;
    const int tile = rb * gridDim.x + pass;
    float* mine = partial + (int64_t(tile) * splits + s) * kElems * kThreads + threadIdx.x;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int c = 0; c < 4; ++c) __stcg(mine + ((m * NT + t) * 4 + c) * kThreads, acc[m][t][c]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* all = partial + int64_t(tile) * splits * kElems * kThreads + threadIdx.x;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int e = ((m * NT + t) * 4 + c) * kThreads;
          float v = __ldcg(all + e);
          for (int j = 1; j < splits; ++j) v += __ldcg(all + int64_t(j) * kElems * kThreads + e);
          acc[m][t][c] = v;
        }
    if (threadIdx.x == 0) counters[tile] = 0;  // ready for the next call (and graph replay)
  }

#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t row = r0 + 16 * m + gemv::acc_row(lane, c);
        const int tok = tok0 + 8 * t + gemv::acc_col(lane, c);
        if (row >= n_out || tok >= n_rows) continue;
        const int64_t i = int64_t(tok) * n_out + row;
        if constexpr (kEpi == kStoreT)
          static_cast<T*>(out)[i] = from_f32<T>(acc[m][t][c]);
        else if constexpr (kEpi == kStoreF32)
          static_cast<float*>(out)[i] = acc[m][t][c];
        else
          static_cast<float*>(out)[i] += acc[m][t][c];
      }
    }
}

template <typename T, int NT, int kEpi>
void launch(void* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
            const DecodeGemmPlan& plan, cudaStream_t stream) {
  constexpr int TB = 8 * NT, smem = gemv::stage_bytes<T>(TB);
  const dim3 grid(unsigned((n_rows + TB - 1) / TB), unsigned(plan.splits),
                  unsigned((n_out + 32 * kWarps - 1) / (32 * kWarps)));
  LFM2_CHECK(grid.z < 65536, "linear_decode: ", n_out, " output features exceed one launch");
  float* partial = nullptr;
  int* counters = nullptr;
  if (plan.splits > 1) {
    const DecodeWorkspace ws = decode_gemm_workspace();
    partial = ws.partial;
    counters = ws.counters;
    LFM2_CHECK(int64_t(grid.x) * grid.z <= ws.n_counters &&
                   int64_t(grid.x) * grid.z * plan.splits * kThreads * 2 * NT * 4 * 4 <= ws.partial_bytes,
               "linear_decode: ", n_rows, " x ", n_in, " -> ", n_out, " exceeds the decode workspace");
  }
  raise_smem_limit(reinterpret_cast<const void*>(&linear_decode_kernel<T, NT, kEpi>), smem);
  linear_decode_kernel<T, NT, kEpi><<<grid, kThreads, smem, stream>>>(out, in, weight, int(n_rows), n_in, n_out,
                                                                      plan.k_slice, plan.splits, partial, counters);
  CUDA_CHECK_LAUNCH("linear_decode_kernel");
}

// Tokens per block (8 NT) from the row count: one block of tokens up to 64 rows, then passes of 64
// (adjacent blocks of one weight tile, so the passes after the first find it in L2).
template <typename T, int kEpi>
void run_chunk(void* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
               const DecodeGemmPlan& plan, cudaStream_t stream) {
  if (n_rows <= 8)
    launch<T, 1, kEpi>(out, in, weight, n_rows, n_in, n_out, plan, stream);
  else if (n_rows <= 16)
    launch<T, 2, kEpi>(out, in, weight, n_rows, n_in, n_out, plan, stream);
  else if (n_rows <= 32)
    launch<T, 4, kEpi>(out, in, weight, n_rows, n_in, n_out, plan, stream);
  else
    launch<T, 8, kEpi>(out, in, weight, n_rows, n_in, n_out, plan, stream);
}

template <typename T, int kEpi>
void decode_gemm(void* out, int64_t out_elem, const T* in, const T* weight, int64_t n_rows, int64_t n_in,
                 int64_t n_out, cudaStream_t stream) {
  if (n_rows == 0 || n_out == 0) return;
  LFM2_CHECK(n_in % 8 == 0 && aligned16(in) && aligned16(weight), "linear_decode: n_in (", n_in,
             ") must be a multiple of 8 and in, weight 16-byte aligned");
  LFM2_CHECK(n_in < (int64_t(1) << 31) && n_out < (int64_t(1) << 31), "linear_decode: sizes ", n_in, " -> ", n_out,
             " too large");
  const DecodeGemmPlan plan = decode_gemm_plan(n_in, n_out);
  char* o = static_cast<char*>(out);
  for (int64_t r = 0; r < n_rows; r += kChunkRows)
    run_chunk<T, kEpi>(o + r * n_out * out_elem, in + r * n_in, weight, std::min(kChunkRows, n_rows - r), n_in, n_out,
                       plan, stream);
}

int g_force_splits = 0;  // decode_gemm_force_splits
bool g_force_path = false;  // decode_gemm_force_path
DecodeGemmPath g_forced;

// The measured choice per model shape (cuda_bench_decode, H100, bf16: the least time at 32 + 256
// rows among the kernel, cuBLASLt's picks at 16..256 rows and its pinned algorithm; ms at 32 / 256
// rows, against the pinned algorithm's). Other shapes: kDefaultPath.
struct PathRule {
  int64_t n_in, n_out;
  DecodeGemmPath path;
};
constexpr DecodeGemmPath kDefaultPath{DecodeGemmPath::kLt, 128};
constexpr PathRule kPathTable[] = {
    {2048, 3072, {DecodeGemmPath::kLt, 128}},   // attention qkv: 0.0097 / 0.0114 (pinned 0.0225 / 0.0230)
    {2048, 2048, {DecodeGemmPath::kLt, 256}},   // attention out, conv out (+= x): 0.0089 / 0.0081 (0.023 / 0.024)
    {2048, 6144, {DecodeGemmPath::kLt, 128}},   // conv in: 0.0116 / 0.0151 (0.0226 / 0.0230)
    {2048, 14336, {DecodeGemmPath::kLt, 128}},  // dense w13: 0.0274 / 0.0289 (0.0313 / 0.0349)
    {7168, 2048, {DecodeGemmPath::kLt, 256}},   // dense w2 (+= x): 0.0207 / 0.0207 (0.0664 / 0.0682)
    {2048, 32, {DecodeGemmPath::kLt, 256}},     // router logits (fp32): 0.0072 / 0.0070 (0.0077 / 0.0074)
    {2048, 65536, {DecodeGemmPath::kLt, 128}},  // LM head (fp32): 0.1070 / 0.1358 (0.1340 / 0.1596)
};

template <typename T, int kEpi>
void decode_product(void* out, int64_t out_elem, const T* in, const T* weight, int64_t n_rows, int64_t n_in,
                    int64_t n_out, cudaStream_t stream) {
  const DecodeGemmPath path = decode_gemm_path(n_in, n_out);
  if (path.kind == DecodeGemmPath::kKernel) {
    decode_gemm<T, kEpi>(out, out_elem, in, weight, n_rows, n_in, n_out, stream);
    return;
  }
  const LtOut kind = kEpi == kStoreT ? LtOut::kT : kEpi == kStoreF32 ? LtOut::kF32 : LtOut::kAddF32;
  linear_lt_at<T>(out, kind, in, weight, n_rows, n_in, n_out, path.plan_rows, stream);
}

}  // namespace

DecodeGemmPath decode_gemm_path(int64_t n_in, int64_t n_out) {
  if (n_in % 8 != 0 || n_out % 8 != 0) return {DecodeGemmPath::kKernel, 0};  // cuBLASLt wants 16-byte rows
  if (g_force_path) return g_forced;
  for (const PathRule& r : kPathTable)
    if (r.n_in == n_in && r.n_out == n_out) return r.path;
  return kDefaultPath;
}

void decode_gemm_force_path(const DecodeGemmPath* path) {
  LFM2_CHECK(path == nullptr || path->kind == DecodeGemmPath::kKernel || path->plan_rows > 0,
             "decode_gemm_force_path: plan rows ", path ? path->plan_rows : 0);
  g_force_path = path != nullptr;
  if (path) g_forced = *path;
}

void decode_gemm_force_splits(int splits) {
  LFM2_CHECK(splits >= 0 && splits <= 64, "decode_gemm_force_splits: ", splits);
  g_force_splits = splits;
}

DecodeGemmPlan decode_gemm_plan(int64_t n_in, int64_t n_out) {
  const int64_t blocks = (n_out + 127) / 128;
  int splits = 1;
  while (splits < kMaxSplits && blocks * splits * 2 <= kTargetBlocks && n_in >= int64_t(splits) * 2 * kMinSlice)
    splits *= 2;
  if (g_force_splits > 0) splits = g_force_splits;
  while (splits > 1 && splits * blocks * 128 * kChunkRows * 4 > int64_t(kDecodeWorkspaceBytes)) splits /= 2;
  const int64_t blocks_k = (n_in + gemv::kBlockK - 1) / gemv::kBlockK;
  DecodeGemmPlan p;
  p.splits = splits;
  p.k_slice = (blocks_k + splits - 1) / splits * gemv::kBlockK;
  return p;
}

template <typename T>
void linear_decode(T* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                   cudaStream_t stream, bool tf32) {
  if constexpr (std::is_same<T, float>::value)
    linear<float>(out, in, weight, n_rows, n_in, n_out, stream, tf32);
  else
    decode_product<T, kStoreT>(out, sizeof(T), in, weight, n_rows, n_in, n_out, stream);
}

template <typename T>
void linear_f32out_decode(float* out, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                          cudaStream_t stream, bool tf32) {
  if constexpr (std::is_same<T, float>::value)
    linear_f32out<float>(out, in, weight, n_rows, n_in, n_out, stream, tf32);
  else
    decode_product<T, kStoreF32>(out, 4, in, weight, n_rows, n_in, n_out, stream);
}

template <typename T>
void linear_add_f32_decode(float* x, const T* in, const T* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                           cudaStream_t stream, bool tf32) {
  if constexpr (std::is_same<T, float>::value)
    linear_add_f32<float>(x, in, weight, n_rows, n_in, n_out, stream, tf32);
  else
    decode_product<T, kAddF32>(x, 4, in, weight, n_rows, n_in, n_out, stream);
}

#define INST(T)                                                                                                    \
  template void linear_decode<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);          \
  template void linear_f32out_decode<T>(float*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool); \
  template void linear_add_f32_decode<T>(float*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t, bool);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
