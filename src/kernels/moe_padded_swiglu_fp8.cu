// The FP8 experts' gate/up product over rows padded per expert with the SwiGLU and its e4m3
// quantization in the epilogue (grouped_gemm_fp8.h: moe_grouped_matmul_fp8_padded_swiglu): the
// padded product's mainloop (padded_gemm_sm90.cuh), its scheduler in pair mode (each CTA computes
// the gate tile of 128 rows x 128 columns, then the up tile of the same rows and columns), and an
// epilogue that keeps the gate tile's bf16 values in registers and, at the up tile, writes the
// down product's input: e4m3 codes of silu(g) u with one scale per (row, 128 columns) — the 128
// columns of the tile, one activation group. No bf16 [gate | up] is written or read again (at 8,192
// tokens x top-4: 2 x 245 MB a layer), and the SwiGLU's own launch is gone. The bits are
// moe_swiglu_quantize_e4m3's on the plain product's bf16 output: g and u rounded to bf16 as that
// output is, then swiglu_e4m3's silu, amax, factor and codes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cutlass/arch/barrier.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/operator_epilogue.cuh"
#include "kernels/cuda/padded_gemm_sm90.cuh"
#include "kernels/cuda/swiglu_e4m3.cuh"

namespace lfm2::cuda::grouped {
namespace {

using namespace cute;

constexpr int kTileM = 128, kTileN = 128;
constexpr int kThreads = 256;                       // the two consumer warpgroups
constexpr int kValues = kTileM * kTileN / kThreads;  // accumulators a thread: 64

// An operator-style epilogue (run through CUTLASS's Sm90TmaWarpSpecializedAdapter, as the bf16
// grouped kernel's SwigluEpilogue) for PaddedTileScheduler<true>'s tile order. A thread keeps its
// gate values in 32 registers (bf16 pairs) across the up tile's mainloop (168 registers without
// spills, of the 232 a consumer thread has; in shared memory they cost the mainloop a stage). Its
// shared memory: the codes tile, 128-byte rows whose 16-byte chunks are XOR-swizzled by the row
// (the 8 rows of a warp's 2-byte stores in 8 different chunks), stored to the output by 16-byte
// chunks.
class SwigluE4m3Epilogue : public OperatorEpilogueBase<cutlass::float_e4m3_t> {
 public:
  using EpilogueSchedule = cutlass::epilogue::NoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using StrideC = cute::Stride<int64_t, _1, int64_t>;
  using StrideD = StrideC;
  struct SharedStorage {
    alignas(128) uint8_t codes[kTileM * kTileN];
  };
  using TensorMapStorage = SharedStorage;

  struct Arguments {
    uint8_t* q = nullptr;     // (m_pad, inter) e4m3
    float* scales = nullptr;  // (inter / 128, m_pad): (row, group) at scales[group * m_pad + row]
  };
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, Arguments const& args) {
    auto s = append<4>(shape, 1);
    // N = 2 inter, inter a multiple of a cluster's N tiles (the pairs' scheduler), M of the tile
    constexpr int kPairTiles = 2 * kTileN * decltype(size<1>(padded::Cluster{}))::value;
    return args.q && args.scales && get<1>(s) % kPairTiles == 0 && get<0>(s) % kTileM == 0;
  }

  CUTLASS_HOST_DEVICE SwigluE4m3Epilogue(Params const& params) : params_(params) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL shape, BlockShapeMNK, BlockCoordMNKL blk_coord,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma, ResidueMNK,
                                 int thread_idx, char* smem) {
    static_assert(is_static<FrgLayout>::value && decltype(size(acc))::value == kValues, "a 128 x 128 tile");
    SharedStorage& st = *reinterpret_cast<SharedStorage*>(smem);
    const int64_t m_pad = get<0>(shape), inter = get<1>(shape) / 2;
    const int half_tiles = int(inter / kTileN);
    const int m_tile = int(get<0>(blk_coord)), n_tile = int(get<1>(blk_coord));
    if (n_tile < half_tiles) return keep_gate(acc);
    // the thread's (row, column) of each value, in the tile
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    float h[kValues];
    swiglu(h, acc);
    const int r0 = get<0>(tc(0));
    float s[2], r[2];
    group_scales(s, r, h, tc, r0);
    // the previous up tile's codes stored by every thread before this tile's overwrite them
    cutlass::arch::NamedBarrier::sync(kThreads, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    put_codes(st, h, tc, r0, s, r);
    const int n_group = n_tile - half_tiles;
    if ((thread_idx & 3) == 0) {  // one lane of the four of a row (the wgmma layout's quad)
      float* sc = params_.scales + int64_t(n_group) * m_pad + int64_t(m_tile) * kTileM;
      sc[r0] = s[0];
      sc[r0 + 8] = s[1];
    }
    cutlass::arch::NamedBarrier::sync(kThreads, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);  // all codes in
    store_codes(st, thread_idx, params_.q + int64_t(m_tile) * kTileM * inter + int64_t(n_group) * kTileN, inter);
  }

 private:
  // The codes tile's layout: 128-byte rows whose 16-byte chunk c sits at chunk c XOR row % 8.
  CUTLASS_DEVICE static int chunk_offset(int chunk, int row) { return ((chunk ^ row) & 7) << 4; }
  CUTLASS_DEVICE static int code_offset(int row, int col) {
    return row * kTileN + chunk_offset(col >> 4, row) + (col & 15);
  }

  // The gate tile: its values rounded to bf16 (the plain product's output), kept for the up tile.
  template <class Acc>
  CUTLASS_DEVICE void keep_gate(Acc const& acc) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kValues; i += 2) gate_[i / 2] = __floats2bfloat162_rn(acc(i), acc(i + 1));
  }

  // h = silu(g) u from the kept gate and this tile's up, both as bf16 (moe_swiglu_quantize_e4m3's
  // inputs), in fp32.
  template <class Acc>
  CUTLASS_DEVICE void swiglu(float (&h)[kValues], Acc const& acc) const {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kValues; i += 2) {
      const __nv_bfloat162 g = gate_[i / 2], u = __floats2bfloat162_rn(acc(i), acc(i + 1));
      h[i] = swiglu_e4m3::silu_fast(__low2float(g)) * __low2float(u);
      h[i + 1] = swiglu_e4m3::silu_fast(__high2float(g)) * __high2float(u);
    }
  }

  // The scale and code factor of the thread's two rows (r0 and r0 + 8 in the wgmma layout, each
  // shared by the four lanes of a quad): the amax over the row's 128 columns.
  template <class Coords>
  CUTLASS_DEVICE static void group_scales(float (&s)[2], float (&r)[2], const float (&h)[kValues], Coords const& tc,
                                          int r0) {
    float amax[2] = {0.f, 0.f};
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kValues; ++i) {
      const int dr = get<0>(tc(i)) - r0;
      if (dr != 0 && dr != 8) __trap();  // not the layout this epilogue is written for
      amax[dr >> 3] = fmaxf(amax[dr >> 3], fabsf(h[i]));
    }
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 2; ++j) {
      amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 1));
      amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 2));
      s[j] = swiglu_e4m3::scale_of(amax[j]);
      r[j] = swiglu_e4m3::code_factor(amax[j]);
    }
  }

  // The thread's codes into the codes tile, two columns (n, n + 1) a store. A thread's columns are
  // c0 + 8 m (c0 = 2 (lane % 4) < 8, even) in rows r0 and r0 + 8, so a value's code_offset is its
  // row's base plus the chunk of dc (its column past c0, a static multiple of 8) under the rows'
  // common r0 % 8, plus dc % 16: one XOR and one add a store, the rest folded. The common case, both
  // rows' codes by a factor, is tested once for the tile, not once a store.
  template <class Coords>
  CUTLASS_DEVICE static void put_codes(SharedStorage& st, const float (&h)[kValues], Coords const& tc, int r0,
                                       const float (&s)[2], const float (&r)[2]) {
    const int c0 = get<1>(tc(0));
    if (c0 >= 8 || (c0 & 1)) __trap();  // not the layout this epilogue is written for
    const int row_base[2] = {r0 * kTileN + c0, (r0 + 8) * kTileN + c0};
    auto put = [&](auto code) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kValues; i += 2) {
        const int j = (get<0>(tc(i)) - r0) >> 3, dc = get<1>(tc(i)) - c0;
        if (get<1>(tc(i + 1)) != get<1>(tc(i)) + 1 || get<0>(tc(i + 1)) != get<0>(tc(i)) || (dc & 7)) __trap();
        *reinterpret_cast<uint16_t*>(st.codes + row_base[j] + chunk_offset(dc >> 4, r0) + (dc & 15)) =
            uint16_t(code(h[i], h[i + 1], j));
      }
    };
    if (r[0] > 0 && r[1] > 0)
      put([&](float a, float b, int j) { return swiglu_e4m3::e4m3x2_sat(a * r[j], b * r[j]); });
    else
      put([&](float a, float b, int j) { return swiglu_e4m3::codes2(a, b, s[j], r[j]); });
  }

  // The codes tile to q (row stride ld bytes) by 16-byte chunks: a warp writes 4 whole 128-byte rows.
  CUTLASS_DEVICE static void store_codes(SharedStorage const& st, int t, uint8_t* q, int64_t ld) {
    constexpr int kChunks = kTileM * kTileN / 16;
    CUTLASS_PRAGMA_UNROLL
    for (int c = t; c < kChunks; c += kThreads) {
      const int row = c / (kTileN / 16), chunk = c % (kTileN / 16);
      const uint4 v = *reinterpret_cast<const uint4*>(st.codes + code_offset(row, chunk * 16));
      *reinterpret_cast<uint4*>(q + int64_t(row) * ld + chunk * 16) = v;
    }
  }

  Params params_;
  __nv_bfloat162 gate_[kValues / 2];  // the gate tile's values, in registers until its up tile
};

using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<SwigluE4m3Epilogue>;
using Static = padded::PaddedGemm<Epilogue, true>;
using Dynamic = padded::PaddedGemm<Epilogue, true, true>;

template <class Kernel>
typename Kernel::Arguments swiglu_args(uint8_t* q, float* scales, const uint8_t* in, const float* in_scales,
                                       const uint8_t* w13, const float* w13_scales, const int32_t* tile_expert,
                                       const int32_t* used_rows, int m_pad, int n_experts, int n_in, int inter,
                                       int device, int sm_count) {
  auto args = Kernel::arguments(in, in_scales, w13, w13_scales, tile_expert, used_rows, m_pad, n_experts, n_in,
                                2 * inter, device, sm_count);
  args.epilogue.q = q;
  args.epilogue.scales = scales;
  return args;
}

template <class Kernel>
size_t workspace_bytes(int64_t m_pad, int64_t inter, int64_t n_in, int sm_count) {
  return Kernel::Gemm::get_workspace_size(swiglu_args<Kernel>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                              nullptr, nullptr, int(m_pad), 1, int(n_in), int(inter),
                                                              0, sm_count));
}

template <class Kernel>
void run(uint8_t* q, float* scales, const uint8_t* in, const float* in_scales, const uint8_t* w13,
         const float* w13_scales, const int32_t* tile_expert, const int32_t* used_rows, int64_t m_pad,
         int64_t n_experts, int64_t n_in, int64_t inter, void* workspace, int sm_count, int device,
         cudaStream_t stream) {
  Kernel::run(swiglu_args<Kernel>(q, scales, in, in_scales, w13, w13_scales, tile_expert, used_rows, int(m_pad),
                                  int(n_experts), int(n_in), int(inter), device, sm_count),
              workspace, stream, "FP8 padded gate/up GEMM with the SwiGLU");
}

}  // namespace

size_t fp8_padded_swiglu_workspace_bytes(int64_t m_pad, int64_t inter, int64_t n_in, int sm_count) {
  return std::max(workspace_bytes<Static>(m_pad, inter, n_in, sm_count),
                  workspace_bytes<Dynamic>(m_pad, inter, n_in, sm_count));
}

void run_fp8_padded_swiglu(uint8_t* q, float* scales, const uint8_t* in, const float* in_scales, const uint8_t* w13,
                           const float* w13_scales, const int32_t* tile_expert, const int32_t* used_rows,
                           int64_t m_pad, int64_t n_experts, int64_t n_in, int64_t inter, void* workspace,
                           int sm_count, int device, cudaStream_t stream) {
  (fp8_padded_dynamic() ? run<Dynamic> : run<Static>)(q, scales, in, in_scales, w13, w13_scales, tile_expert,
                                                      used_rows, m_pad, n_experts, n_in, inter, workspace, sm_count,
                                                      device, stream);
}

}  // namespace lfm2::cuda::grouped
