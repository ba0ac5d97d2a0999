// Embedding lookup on the GPU: one thread per output element, rows converted to fp32.
#include "common/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

template <typename T>
__global__ void embedding_kernel(float* out, const int32_t* ids, const T* table, int64_t n_tokens, int64_t vocab,
                                 int64_t hidden) {
  const int64_t n = n_tokens * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, c = i - t * hidden;
    const int32_t id = ids[t];
    out[i] = (id >= 0 && id < vocab) ? to_f32(table[int64_t(id) * hidden + c]) : __int_as_float(0x7fc00000);
  }
}

}  // namespace

template <typename T>
void embedding(float* out, const int32_t* ids, const T* table, int64_t n_tokens, int64_t vocab, int64_t hidden,
               cudaStream_t stream) {
  if (n_tokens * hidden == 0) return;
  embedding_kernel<<<grid_for(n_tokens * hidden, 256 * 4), 256, 0, stream>>>(out, ids, table, n_tokens, vocab, hidden);
  CUDA_CHECK_LAUNCH("embedding_kernel");
}

#define INST(T) template void embedding<T>(float*, const int32_t*, const T*, int64_t, int64_t, int64_t, cudaStream_t);
LFM2_FOR_EACH_T(INST)
#undef INST

}  // namespace lfm2::cuda
