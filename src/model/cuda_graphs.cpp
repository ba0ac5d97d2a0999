#include "model/cuda_graphs.h"

#include "common/cuda_check.h"

namespace lfm2 {

cudaGraphExec_t CudaGraphs::capture(cudaStream_t stream, const std::function<void()>& queue) {
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    queue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);  // leaves the stream usable; the error is the first one
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  return exec;
}

void CudaGraphs::launch(cudaGraphExec_t graph, cudaStream_t stream) { CUDA_CHECK(cudaGraphLaunch(graph, stream)); }

void CudaGraphs::forget(Kind kind) {
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (it->first.kind == kind) {
      cudaGraphExecDestroy(it->second);
      it = graphs_.erase(it);
    } else {
      ++it;
    }
  }
}

void CudaGraphs::release() {
  for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
  graphs_.clear();
}

}  // namespace lfm2
