// The Hopper (sm_90a) grouped GEMM behind cuda::moe_grouped_matmul for bf16 / fp16: CUTLASS 3.x's
// ptr-array grouped kernel (TMA loads, wgmma, warp-specialised persistent CTAs), one GEMM per
// expert, with the problem shapes and pointer arrays written on the device from the routing offsets
// (host_problem_shapes = nullptr: the host never learns the per-expert row counts).
//
// This header has no CUTLASS in it: the kernels are instantiated in moe_grouped_gemm_bf16.cu and
// moe_grouped_gemm_fp16.cu (compiled for sm_90a only, in the lfm2_kernels_cutlass target), and the
// dispatcher in moe_grouped_matmul.cu picks a tile configuration from kGroupedTiles below.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace lfm2::cuda::grouped {

// One tile configuration of the CUTLASS kernel. The list is the compiled set; which one runs for a
// given product is the table kGroupedChoice below (chosen by measurement, docs/cuda-backend.md).
struct TileConfig {
  const char* name;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  bool pingpong;  // else cooperative (two consumer warpgroups split the tile's rows)
};

// Every configuration instantiated (index = config id). Keep in sync with the type list in
// grouped_gemm_sm90.cuh (kConfigs there static_asserts the count).
inline constexpr TileConfig kGroupedTiles[] = {
    {"coop 128x128x64 c1x2", 128, 128, 64, 1, 2, false},
    {"coop 256x128x64 c1x2", 256, 128, 64, 1, 2, false},
    {"coop 128x256x64 c1x2", 128, 256, 64, 1, 2, false},
    {"pingpong 128x128x64 c1x2", 128, 128, 64, 1, 2, true},
};
inline constexpr int kGroupedConfigCount = int(sizeof(kGroupedTiles) / sizeof(kGroupedTiles[0]));

// The choice: the first row whose bound exceeds the mean rows per expert (max_rows / n_experts,
// known on the host from the token count alone) names the configuration. Every configuration gives
// bit-identical results (same k order, no split-K; tested), so the choice never changes numbers.
// Measured on an H100 (docs/cuda-backend.md, "Tile table"): at 128 rows per expert (1024 tokens)
// the 128 x 128 tiles lead (a 256-row tile wastes half its work), from 512 rows on 256 x 128.
// The gate/up product with SwiGLU fused exists for the configurations this table names.
struct TileChoice {
  int64_t mean_rows_below;
  int config;
};
inline constexpr TileChoice kGroupedChoice[] = {
    {256, 0},        // up to 2048 tokens x top-4 over 32 experts: a 128-row tile wastes least
    {INT64_MAX, 1},  // larger: the 256 x 128 cooperative tile (SPEC §4: 633 / 731 TFLOP/s)
};

// The configuration moe_grouped_matmul runs for max_rows rows over n_experts experts: the table,
// unless force_config() (or LFM2_GROUPED_CONFIG at start-up) names one (-1 gives the table back).
// For tuning benchmarks and for the tests that run every configuration.
int pick_config(int64_t max_rows, int64_t n_experts);
void force_config(int config);

// Device-side argument arrays of one grouped product (problem shapes, pointers, strides for every
// expert) plus CUTLASS's own workspace (TMA descriptors per SM), carved from one caller buffer.
size_t workspace_bytes(int64_t n_experts, int sm_count);

// out (rows, n_out) = in (rows, n_in) W_e^T for expert e's rows [offsets[e], offsets[e+1]);
// W (n_experts, n_out, n_in). n_in and n_out multiples of 8, pointers 16-byte aligned (checked by
// the caller). Queues two kernels on `stream` (argument setup, the GEMM); never allocates.
template <typename T>
void run(int config, T* out, const T* in, const T* weight, const int32_t* offsets, int64_t n_experts, int64_t n_in,
         int64_t n_out, void* workspace, int sm_count, int device, cudaStream_t stream);

// The gate/up product with SwiGLU in the epilogue: act (rows, inter) = silu(gate) * up where w13
// (n_experts, 2 inter, n_in) has each expert's w1 and w3 rows interleaved (2j: w1 row j, 2j + 1: w3
// row j). config 0 or 1 (the table's). Same requirements as run().
template <typename T>
void run_swiglu(int config, T* act, const T* in, const T* w13, const int32_t* offsets, int64_t n_experts,
                int64_t n_in, int64_t inter, void* workspace, int sm_count, int device, cudaStream_t stream);


}  // namespace lfm2::cuda::grouped
