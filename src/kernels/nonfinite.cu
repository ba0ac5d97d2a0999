// cuda::count_nonfinite (cpu::count_nonfinite without the position): a grid-stride count of NaN /
// +-Inf, reduced per warp and added once per warp into *count. The caller zeroes *count (device or
// mapped pinned memory) before the launch and reads it once the stream has passed this point;
// lfm2-rank checks one microbatch's hidden states this way (model/checked_stage.h).
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) count_nonfinite_kernel(unsigned int* count, const float* in, int64_t n) {
  unsigned int c = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    c += isfinite(in[i]) ? 0u : 1u;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

}  // namespace

void count_nonfinite(unsigned int* count, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  count_nonfinite_kernel<<<int(blocks < 1024 ? blocks : 1024), kThreads, 0, stream>>>(count, in, n);
  CUDA_CHECK_LAUNCH("count_nonfinite");
}

}  // namespace lfm2::cuda
