// Token choice's end-of-sequence rules on the GPU (the CPU twins: cpu::choose_tokens' rule that an
// ended sequence repeats its EOS id, and cpu::finished_flags). Greedy generation chooses on the
// device: cuda::argmax_margin, then apply_eos; sampling chooses on the host (cpu::choose_tokens).
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

// tokens[i] = the chosen top-1, or, once sequence first_seq + i (slots[i]) has ended, the EOS id it
// produced (ended: one per sequence, -1 until then).
__global__ void eos_kernel(int32_t* tokens, const int32_t* top, int64_t n, int64_t first_seq, const int32_t* eos,
                           int n_eos, int32_t* ended, const int32_t* slots) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t s = slots ? int64_t(slots[i]) : first_seq + i;
  int32_t t = top[i];
  const int32_t e0 = ended[s];
  if (e0 >= 0) {
    t = e0;
  } else {
    for (int e = 0; e < n_eos; ++e)
      if (t == eos[e]) ended[s] = t;
  }
  tokens[i] = t;
}

__global__ void restart_kernel(int32_t* ended, const int32_t* slots, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) ended[slots[i]] = -1;
}

// 1 where the fed-back token is an EOS id: the sequence has finished (choose repeats EOS after it).
__global__ void finished_flags_kernel(float* flags, const int32_t* tokens, int64_t n, const int32_t* eos, int n_eos) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float f = 0.f;
  for (int e = 0; e < n_eos; ++e)
    if (tokens[i] == eos[e]) f = 1.f;
  flags[i] = f;
}

}  // namespace

void apply_eos(int32_t* tokens, const int32_t* top, int64_t n, int64_t first_seq, const int32_t* eos, int n_eos,
               int32_t* ended, cudaStream_t stream, const int32_t* slots) {
  if (n == 0) return;
  eos_kernel<<<grid_for(n, 256), 256, 0, stream>>>(tokens, top, n, first_seq, eos, n_eos, ended, slots);
  CUDA_CHECK_LAUNCH("eos_kernel");
}

void restart_ended(int32_t* ended, const int32_t* slots, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  restart_kernel<<<grid_for(n, 256), 256, 0, stream>>>(ended, slots, n);
  CUDA_CHECK_LAUNCH("restart_kernel");
}

void finished_flags(float* flags, const int32_t* tokens, int64_t n, const int32_t* eos, int n_eos,
                    cudaStream_t stream) {
  if (n == 0) return;
  finished_flags_kernel<<<grid_for(n, 256), 256, 0, stream>>>(flags, tokens, n, eos, n_eos);
  CUDA_CHECK_LAUNCH("finished_flags_kernel");
}

}  // namespace lfm2::cuda
