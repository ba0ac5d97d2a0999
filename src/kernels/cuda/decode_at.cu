// The decode step's device arguments: (first_seq, step) written in stream order, so that the kernels
// of a decode step captured once in a CUDA Graph read them from the device and the graph replays
// for any microbatch and step (see ops.h, "decode rows").
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace lfm2::cuda {
namespace {

__global__ void set_decode_at_kernel(int64_t* at, int64_t first_seq, int64_t step) {
  at[0] = first_seq;
  at[1] = step;
}

}  // namespace

void set_decode_at(int64_t* at, int64_t first_seq, int64_t step, cudaStream_t stream) {
  set_decode_at_kernel<<<1, 1, 0, stream>>>(at, first_seq, step);
  CUDA_CHECK_LAUNCH("set_decode_at_kernel");
}

}  // namespace lfm2::cuda
