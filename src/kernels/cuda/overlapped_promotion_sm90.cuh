// CUTLASS 4.2's sm90 blockwise-scaled FP8 mainloop with its promotions overlapped: a consumer
// warpgroup issues k tile t + 1's wgmmas (into a second set of partial sums) before it promotes
// k tile t's (accum += partial sums x the tile's scales). CUTLASS's mainloop waits for a tile's
// wgmmas to finish before it promotes them, so the tensor cores wait while both consumer
// warpgroups promote (ncu of the plain gate/up at 8,192 tokens on an H200: the tensor pipe busy
// 65.7 % of the cycles with CUTLASS's mainloop, 72.2 % with this one).
// The same wgmmas and the same promotions in the same order: the same bits. Everything but mma()
// is CUTLASS's; the padded products (padded_gemm_sm90.cuh) build on it.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace lfm2::cuda::grouped::padded {

template <class Base>
struct OverlappedPromotion : Base {
  using TiledMma = typename Base::TiledMma;
  using Scale = typename Base::ElementBlockScale;
  static_assert(Base::ScaleMsPerTile > 1 && Base::ScaleNsPerTile == 1,
                "overlapped promotion: per-row scales of A and one scale of B a tile");
  static_assert(Base::ScalePromotionInterval * cute::size<2>(typename TiledMma::AtomShape_MNK{}) ==
                    cute::size<2>(typename Base::TileShape{}),
                "overlapped promotion: one promotion every k tile");

  // The stages' scales as (BLK_M, BLK_N, (BLK_K, PIPE)) views over the tile's C: A's broadcast along
  // N, B's along M (CUTLASS's mainloop views them so).
  CUTLASS_DEVICE static auto scale_views(typename Base::TensorStorage& smem) {
    using namespace cute;
    using LSFA = typename Base::SmemLayoutSFA;
    using LSFB = typename Base::SmemLayoutSFB;
    using Tile = typename Base::TileShape;
    Tensor sfa = make_tensor(make_smem_ptr(smem.smem_SFA.data()),
                             make_layout(make_shape(get<0>(shape(LSFA{})), get<1>(Tile{}),
                                                    make_shape(get<1>(shape(LSFA{})), get<2>(shape(LSFA{})))),
                                         make_stride(get<0>(stride(LSFA{})), _0{},
                                                     make_stride(get<1>(stride(LSFA{})), get<2>(stride(LSFA{}))))));
    Tensor sfb = make_tensor(make_smem_ptr(smem.smem_SFB.data()),
                             make_layout(make_shape(get<0>(Tile{}), get<0>(shape(LSFB{})),
                                                    make_shape(get<1>(shape(LSFB{})), get<2>(shape(LSFB{})))),
                                         make_stride(_0{}, get<0>(stride(LSFB{})),
                                                     make_stride(get<1>(stride(LSFB{})), get<2>(stride(LSFB{}))))));
    return cute::make_tuple(sfa, sfb);
  }

  // accum += a tile's partial sums x their scales (CUTLASS's promotion, the same FMAs).
  template <class Accum, class Part, class PartScale>
  CUTLASS_DEVICE static void promote(Accum& accum, Part& part, PartScale const& scale) {
    cute::warpgroup_fence_operand(part);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(accum); ++i) accum(i) += part(i) * scale(i);
  }

  // The consumer warpgroups' mainloop (GemmUniversal's call): accum = sum over the k tiles of the
  // tile's wgmma sums times its scales. Releases every stage but the last, as CUTLASS's does
  // (mma_tail releases that one).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline, typename Base::PipelineState read,
                          FrgTensorC& accum, int k_tiles, int thread_idx, typename Base::TensorStorage& smem,
                          typename Base::Params const&) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), typename Base::SmemLayoutB{});
    auto [sSFA, sSFB] = scale_views(smem);
    constexpr int kWarpGroup = cutlass::NumThreadsPerWarpGroup;
    constexpr int kWarpGroups = size(TiledMma{}) / kWarpGroup;
    const int warp_group = __shfl_sync(0xffffffffu, thread_idx / kWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(make_layout(Int<kWarpGroups>{}, Int<kWarpGroup>{})(warp_group));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (MMA_K, PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));

    // Two sets of partial sums and of their scales (a row's scale of A times the tile's of B)
    Tensor part0 = make_fragment_like(accum), part1 = make_fragment_like(accum);
    Tensor sfa = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));
    Tensor sfb = make_tensor_like<Scale>(tCsSFB(_, _, _, _0{}));
    Tensor scale0 = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));
    Tensor scale1 = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));

    auto token = pipeline.consumer_try_wait(read);
    // The next k tile's wgmmas into part, committed, and its scales into scale.
    auto issue = [&](auto& part, auto& scale) {
      pipeline.consumer_wait(read, token);
      const int stage = read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), sfa);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), sfb);
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(part);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(part);
      const Scale b = sfb(_0{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(sfa)); ++i) filter_zeros(scale)(i) = filter_zeros(sfa)(i) * b;
      ++read;
      token = pipeline.consumer_try_wait(read);
    };
    // The next tile's wgmmas into next; once only those are in flight, the tile before gives its
    // stage back to the producer and is promoted.
    typename Base::PipelineState release = read;
    auto overlap = [&](auto& next, auto& next_scale, auto& done, auto& done_scale) {
      issue(next, next_scale);
      warpgroup_wait<1>();
      pipeline.consumer_release(release);
      ++release;
      promote(accum, done, done_scale);
    };

    clear(accum);
    warpgroup_fence_operand(accum);
    issue(part0, scale0);
    int left = k_tiles - 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; left >= 2; left -= 2) {
      overlap(part1, scale1, part0, scale0);
      overlap(part0, scale0, part1, scale1);
    }
    if (left == 1) {
      overlap(part1, scale1, part0, scale0);
      warpgroup_wait<0>();
      promote(accum, part1, scale1);
    } else {
      warpgroup_wait<0>();
      promote(accum, part0, scale0);
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace lfm2::cuda::grouped::padded
