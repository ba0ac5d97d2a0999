// What CUTLASS's sm90 kernels ask of an operator-style epilogue (one run through
// Sm90TmaWarpSpecializedAdapter) with fp32 accumulators, output elements Element (C never read),
// Params that are its Arguments and no workspace: the
// bf16 grouped kernel's SwigluEpilogue (grouped_gemm_sm90.cuh) and the FP8 padded gate/up's
// SwigluE4m3Epilogue (moe_padded_swiglu_fp8.cu) derive from it.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"

namespace lfm2::cuda::grouped {

template <class Element>
struct OperatorEpilogueBase {
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementOutput = Element;
  using ElementC = Element;  // never read (there is no C operand)
  using ElementD = Element;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  struct ThreadEpilogueOp {
    using ElementOutput = Element;
    using ElementAccumulator = float;
    using ElementCompute = float;
  };

  template <class ProblemShape, class Arguments>
  static constexpr Arguments to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape, class Arguments>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int = 0) {
    return 0;
  }
  template <class ProblemShape, class Arguments>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
};

}  // namespace lfm2::cuda::grouped
