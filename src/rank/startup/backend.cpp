#include "rank/startup/backend.h"

#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/error.h"
#ifdef LFM2_HAVE_CUDA
#include "model/cuda_stage.h"
#include "rank/engine/cuda_busy_timer.h"
#include "rank/startup/gpu_info.h"
#include "rank/transport/nccl_transport.h"
#endif

namespace lfm2 {
namespace {

#ifdef LFM2_HAVE_CUDA
template <size_t N>
void copy_text(char (&dst)[N], const std::string& src) {
  std::snprintf(dst, N, "%s", src.c_str());
}

// The CUDA executor, its replica's NCCL transport and its busy timer; the transport times its
// transfers against the timer's origin.
void make_cuda_backend(Backend& b, const RankOptions& opt, const WorldConfig& pipe, const StageLayers& stage,
                       WeightReader& weights, DType dtype) {
  const double t0 = now_s();
  auto exec = make_cuda_stage(weights, stage, dtype, pipe.local_rank, opt.tf32, opt.cuda_graphs,
                              kNcclReservedSms, opt.kv_dtype == "fp8");
  b.load_us = int64_t((now_s() - t0) * 1e6);
  auto nccl = make_nccl_transport(pipe, *exec, opt.timeout_s);  // the replica's communicators only
  auto timer = make_cuda_busy_timer(*exec);
  nccl->set_timeline([t = timer.get()] { return t->origin(); });
  b.connect = [t = nccl.get()] { t->connect(); };
  b.exec = std::move(exec);
  b.transport = std::move(nccl);
  b.timer = std::move(timer);
}
#endif

}  // namespace

void check_backend_options(const RankOptions& opt) {
  LFM2_CHECK(opt.kv_dtype != "fp8" || opt.device != "cuda" || opt.dtype != "fp32",
             "--kv-dtype fp8: the CUDA backend reads an fp8 KV cache in bf16 or fp16 (--dtype bf16 / fp16), not "
             "fp32");
#ifndef LFM2_HAVE_CUDA
  LFM2_CHECK(opt.device != "cuda", "--device cuda: this build has no CUDA backend (configure with nvcc present)");
  LFM2_CHECK(opt.dtype == "fp32", "--dtype ", opt.dtype, ": the CPU backend computes in fp32 only (", opt.dtype,
             " comes with the CUDA backend)");
  LFM2_CHECK(!opt.tf32, "--tf32: the CPU backend computes in exact fp32 (TF32 comes with the CUDA backend)");
#else
  LFM2_CHECK(opt.device != "cpu" || opt.dtype == "fp32", "--dtype ", opt.dtype,
             ": the CPU backend computes in fp32 only (use --device cuda)");
  LFM2_CHECK(opt.device != "cpu" || !opt.tf32, "--tf32: the CPU backend computes in exact fp32 (use --device cuda)");
#endif
  LFM2_CHECK(!opt.tf32 || opt.dtype == "fp32", "--tf32 applies to --dtype fp32 only, not ", opt.dtype);
}

void check_cpu_fallback(const RankOptions& opt) {
  LFM2_CHECK(opt.dtype == "fp32", "--dtype ", opt.dtype,
             ": the CPU backend computes in fp32 only (--device auto found no GPU on every rank)");
  LFM2_CHECK(!opt.tf32, "--tf32: the CPU backend computes in exact fp32 (--device auto found no GPU on every rank)");
}

bool sees_gpu(const RankOptions& opt) {
#ifdef LFM2_HAVE_CUDA
  return opt.device != "cpu" && visible_gpu_count() > 0;
#else
  (void)opt;
  return false;
#endif
}

GpuFacts this_gpu(const WorldConfig& world) {
  GpuFacts mine;
#ifdef LFM2_HAVE_CUDA
  const int n = visible_gpu_count();
  LFM2_CHECK(world.local_rank < n, "--device cuda: node-local rank ", world.local_rank, " on ", world.host,
             " has no GPU of its own: ", n, " visible there for ", world.local_size,
             " ranks (run at most one rank per GPU)");
  const GpuInfo g = gpu_info(world.local_rank);
  mine.ok = 1;
  mine.device = g.device;
  std::memcpy(mine.uuid, g.uuid, sizeof mine.uuid);
  copy_text(mine.host, world.host);
  copy_text(mine.name, g.name);
  copy_text(mine.uuid_text, g.uuid_string());
#else
  (void)world;
  LFM2_FAIL("--device cuda: this build has no CUDA backend");
#endif
  return mine;
}

Backend make_backend(const RankOptions& opt, const WorldConfig& pipe, const StageLayers& stage, WeightReader& weights,
                     bool use_cuda, DType dtype, int n_threads) {
  Backend b;
#ifdef LFM2_HAVE_CUDA
  if (use_cuda) {
    make_cuda_backend(b, opt, pipe, stage, weights, dtype);
    return b;
  }
#else
  LFM2_CHECK(!use_cuda, "--device cuda: this build has no CUDA backend");
  (void)dtype;
#endif
  const double t0 = now_s();
  b.exec = make_cpu_stage(weights, stage, n_threads, false, opt.kv_dtype == "fp8");
  b.load_us = int64_t((now_s() - t0) * 1e6);
  b.transport = make_mpi_transport(pipe, opt.timeout_s);
  return b;
}

double device_copy_bandwidth(const Backend& backend) {
#ifdef LFM2_HAVE_CUDA
  auto* cuda = dynamic_cast<CudaStageExecutor*>(backend.exec.get());
  return cuda ? copy_bandwidth(cuda->device()) : 0;
#else
  (void)backend;
  return 0;
#endif
}

GpuMemory gpu_memory(const Backend& backend) {
  GpuMemory m;
#ifdef LFM2_HAVE_CUDA
  auto* cuda = dynamic_cast<CudaStageExecutor*>(backend.exec.get());
  if (!cuda) return m;
  const GpuInfo g = gpu_info(cuda->device());
  m.device = g.device;
  m.weight_bytes = backend.exec->weight_bytes();
  m.free_bytes = g.free_bytes;
  m.total_bytes = g.total_bytes;
#else
  (void)backend;
#endif
  return m;
}

}  // namespace lfm2
