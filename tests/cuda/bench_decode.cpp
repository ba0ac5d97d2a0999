// Decode-step kernel timings at LFM2-8B-A1B shapes (not a test; run by hand on a GPU machine):
//   cuda_bench_decode [moe|proj|small|all] [TOKENS,...]   (default all; moe at 8,32,64,128,256 tokens)
// Every figure beside the memory floor: the bytes a kernel must move (weights touched once, plus
// activations) at the device-to-device copy bandwidth measured first in the same process.
//  - moe: one MoE layer at 8..256 tokens (top-4 of 32, hidden 2048, moe 1792, random inputs and
//    router): moe_decode (the whole block: fused router, products, combine; with the next norm too),
//    moe_experts_decode alone for each variant of the products, the first decode kernels with the
//    router by cuBLASLt logits (round 1's line), the prefill path (moe_experts), and moe_decode
//    replayed from a CUDA graph (as the stage runs it).
//  - proj: each projection (and the LM head) at 8..256 rows on every path (the swap-AB kernel,
//    cuBLASLt's picks at 16..256 rows and its pinned large-M algorithm, each fixed for all row
//    counts) and cuBLASLt's own pick per row count; then per shape the path with the least time at
//    32 + 256 rows, and the table's path.
//  - small: rmsnorm, add_rmsnorm, swiglu, router, permutation, combine, the fused decode router,
//    combine + next norm, at 32 and 256 rows.
// CUDA events around batches of calls queued back to back, warm-up first, median of 5 batches.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/cuda/ops.h"
#include "bench_util.h"

namespace lfm2 {
namespace {

using namespace bench;

// ------------------------------------------------------------------------------------------ MoE

template <typename T>
void bench_moe(const char* name, cudaStream_t s, int64_t n, bool variants) {
  const int64_t H = 2048, E = 32, I = 1792, k = 4, P = n * k;
  const cuda::MoeDims dims{H, E, I, k, true, 1.f};
  T* y = rand_dev<T>(n * H, 1, 1.f);
  T* w13 = rand_dev<T>(E * 2 * I * H, 2, 0.02f);
  T* w2 = rand_dev<T>(E * H * I, 3, 0.02f);
  T* wg = rand_dev<T>(E * H, 4, 0.05f);
  float* nw = rand_dev<float>(H, 6, 1.f);
  float* x = rand_dev<float>(n * H, 5, 1.f);
  T* yn = dev_alloc<T>(n * H);
  float* logits = dev_alloc<float>(n * E);
  float* wts = dev_alloc<float>(P);
  int32_t* ids = dev_alloc<int32_t>(P);
  void* scratch = dev_alloc<char>(cuda::moe_experts_decode_scratch_bytes(n, H, E, I, k, sizeof(T)));
  void* scratch_blk = dev_alloc<char>(cuda::moe_decode_scratch_bytes(n, dims, sizeof(T)));
  void* scratch_pf = dev_alloc<char>(cuda::moe_experts_scratch_bytes(n, H, E, I, k, sizeof(T)));
  auto route_lt = [&] {  // round 1's router: cuBLASLt's pinned logits, then top-k + drop
    cuda::linear_f32out(logits, y, wg, n, H, E, s);
    cuda::moe_router_drop(wts, ids, logits, nullptr, nullptr, n, E, k, true, 1.f, s);
  };
  auto block = [&](bool norm) {
    cuda::moe_decode<T>(x, yn, y, wg, nullptr, w13, w2, nullptr, norm ? nw : nullptr, 1e-5f, n, dims, scratch_blk, s);
  };
  route_lt();
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<int32_t> h(static_cast<size_t>(P));
  CUDA_CHECK(cudaMemcpy(h.data(), ids, size_t(P) * 4, cudaMemcpyDeviceToHost));
  std::vector<bool> used(size_t(E), false);
  for (int32_t e : h) used[size_t(e)] = true;
  const int64_t touched = std::count(used.begin(), used.end(), true);
  const double bytes = double(touched) * 3 * I * H * sizeof(T) + double(n) * H * (sizeof(T) + 8);
  const double t_block = median_ms(s, [&] { block(false); });
  const double t_block_norm = median_ms(s, [&] { block(true); });
  const double t_exp = median_ms(s, [&] { cuda::moe_experts_decode(x, y, w13, w2, ids, wts, n, H, E, I, k, scratch, s); });
  cuda::moe_experts_decode_force_variant(1);
  const double t_round1 = median_ms(s, [&] {
    route_lt();
    cuda::moe_experts_decode(x, y, w13, w2, ids, wts, n, H, E, I, k, scratch, s);
  });
  cuda::moe_experts_decode_force_variant(0);
  const double t_pf = median_ms(s, [&] { cuda::moe_experts(x, y, w13, w2, ids, wts, n, H, E, I, k, scratch_pf, s); });
  // the block captured once and replayed, as the stage's decode graphs do
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  block(true);
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double t_graph = median_ms(s, [&] { CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::printf("%-5s moe %4lld tok (%2lld experts, %.0f MB): moe_decode %s | +next norm %7.4f | graph %7.4f | "
              "experts_decode %s | round 1 (+cuBLASLt router) %7.4f | prefill path %7.4f ms\n",
              name, (long long)n, (long long)touched, bytes * 1e-6, bw(bytes, t_block).c_str(), t_block_norm, t_graph,
              bw(bytes, t_exp).c_str(), t_round1, t_pf);
  if (variants) {  // the products' variants (speed only), moe_experts_decode alone
    const char* what[] = {"",          "first kernels", "6 st 1/SM L2",   "8 st 1/SM L2",  "4 st 2/SM L2",
                          "6 st 1/SM", "4 st 2/SM",     "6 st 1/SM items", "4 st 2/SM items",
                          "wgmma 6 st",   "wgmma 4 st 2/SM", "wgmma counter", "wgmma ctr items",
                          "fused 6 st",   "fused 4 st 2/SM", "fused, by blk"};
    for (int v = 1; v <= 15; ++v) {
      cuda::moe_experts_decode_force_variant(v);
      const double t = median_ms(s, [&] { cuda::moe_experts_decode(x, y, w13, w2, ids, wts, n, H, E, I, k, scratch, s); });
      const double tb = median_ms(s, [&] { block(false); });
      std::printf("variant %-5s moe %4lld tok v%d (%-13s): experts_decode %s | moe_decode %7.4f ms\n", name,
                  (long long)n, v, what[v], bw(bytes, t).c_str(), tb);
    }
    cuda::moe_experts_decode_force_variant(0);
  }
  for (void* p : std::initializer_list<void*>{y, w13, w2, wg, nw, x, yn, logits, wts, ids, scratch, scratch_blk,
                                              scratch_pf})
    cudaFree(p);
}

// ---------------------------------------------------------------------------------- projections

struct Proj {
  const char* name;
  int64_t n_in, n_out;
  int kind;  // 0: T out, 1: fp32 out, 2: += fp32 residual
};
const int64_t kProjRows[] = {8, 32, 64, 128, 256};

std::string path_name(int64_t plan_rows) {
  return plan_rows == 0 ? "kernel" : "cuBLASLt@" + std::to_string(plan_rows);
}

// Every candidate path forced in turn (the kernel, then cuBLASLt at these plan rows; 4096: the
// pinned one), its times at kProjRows printed; the path with the least time at 32 + 256 rows.
int64_t sweep_paths(const Proj& p, const std::function<void(int64_t)>& run, cudaStream_t s, double* best_sum) {
  const int64_t plan_rows[] = {0, 16, 32, 64, 128, 256, 4096};
  *best_sum = 1e30;
  int64_t best = -1;
  for (const int64_t pr : plan_rows) {
    cuda::DecodeGemmPath path{pr == 0 ? cuda::DecodeGemmPath::kKernel : cuda::DecodeGemmPath::kLt, pr};
    cuda::decode_gemm_force_path(&path);
    std::string line;
    double t32 = -1, t256 = -1;
    for (const int64_t t : kProjRows) {
      double ms = -1;
      try {
        ms = median_ms(s, [&] { run(t); });
      } catch (const Error& e) {
        std::printf("proj  %-9s path %lld at %lld rows: %s\n", p.name, (long long)pr, (long long)t, e.what());
      }
      char b[32];
      std::snprintf(b, sizeof b, " %8.4f", ms);
      line += b;
      if (t == 32) t32 = ms;
      if (t == 256) t256 = ms;
    }
    cuda::decode_gemm_force_path(nullptr);
    std::printf("proj  %-9s %5lld -> %-5lld %-16s ms at 8/32/64/128/256 rows:%s | 32 + 256: %.4f\n", p.name,
                (long long)p.n_in, (long long)p.n_out, path_name(pr).c_str(), line.c_str(), t32 + t256);
    if (t32 > 0 && t256 > 0 && t32 + t256 < *best_sum) *best_sum = t32 + t256, best = pr;
  }
  return best;
}

// " 0.0123 0.0234 ..." ms at kProjRows rows.
std::string times_line(const std::function<void(int64_t)>& run, cudaStream_t s) {
  std::string line;
  for (const int64_t t : kProjRows) {
    char b[32];
    std::snprintf(b, sizeof b, " %8.4f", median_ms(s, [&] { run(t); }));
    line += b;
  }
  return line;
}

void bench_projections(cudaStream_t s) {
  using T = __nv_bfloat16;
  const Proj projs[] = {{"qkv", 2048, 3072, 0},        {"attn out", 2048, 2048, 2}, {"conv in", 2048, 6144, 0},
                        {"conv out", 2048, 2048, 2},   {"dense w13", 2048, 14336, 0}, {"dense w2", 7168, 2048, 2},
                        {"router", 2048, 32, 1},       {"lm head", 2048, 65536, 1}};
  const int64_t max_t = 256;
  T* a = rand_dev<T>(max_t * 7168, 7, 1.f);
  T* w = rand_dev<T>(65536 * 2048, 8, 0.02f);
  T* o = dev_alloc<T>(max_t * 14336);
  float* x = dev_alloc<float>(max_t * 65536);
  CUDA_CHECK(cudaMemset(x, 0, size_t(max_t * 65536) * 4));
  for (const Proj& p : projs) {
    auto run = [&](int64_t t) {
      if (p.kind == 0) cuda::linear_decode(o, a, w, t, p.n_in, p.n_out, s);
      else if (p.kind == 1) cuda::linear_f32out_decode(x, a, w, t, p.n_in, p.n_out, s);
      else cuda::linear_add_f32_decode(x, a, w, t, p.n_in, p.n_out, s);
    };
    auto cublas = [&](int64_t t) {
      if (p.kind == 0) cuda::linear(o, a, w, t, p.n_in, p.n_out, s);
      else if (p.kind == 1) cuda::linear_f32out(x, a, w, t, p.n_in, p.n_out, s);
      else cuda::linear_add_f32(x, a, w, t, p.n_in, p.n_out, s);
    };
    double best_sum = 0;
    const int64_t best = sweep_paths(p, run, s, &best_sum);
    cuda::set_gemm_pinning(false);
    const std::string line = times_line(cublas, s);
    cuda::set_gemm_pinning(true);
    std::string table_line;
    for (const int64_t t : kProjRows) {
      const int64_t ob = p.kind == 0 ? 2 : p.kind == 1 ? 4 : 8;
      const double bytes = double(p.n_in) * p.n_out * 2 + double(t) * (p.n_in * 2 + p.n_out * ob);
      char b[96];
      std::snprintf(b, sizeof b, " | %lld: %s", (long long)t, bw(bytes, median_ms(s, [&] { run(t); })).c_str());
      table_line += b;
    }
    const cuda::DecodeGemmPath tp = cuda::decode_gemm_path(p.n_in, p.n_out);
    std::printf("proj  %-9s per-size cuBLASLt pick ms:%s\n", p.name, line.c_str());
    std::printf("best  %-9s %5lld -> %-5lld: %s (32 + 256 rows %.4f ms); table's path %s:%s\n", p.name,
                (long long)p.n_in, (long long)p.n_out, path_name(best).c_str(), best_sum,
                (tp.kind == cuda::DecodeGemmPath::kKernel ? std::string("kernel") : path_name(tp.plan_rows)).c_str(),
                table_line.c_str());
  }
  cudaFree(a), cudaFree(w), cudaFree(o), cudaFree(x);
}

// ------------------------------------------------------------------------------- small kernels

void bench_small(cudaStream_t s, int64_t n) {
  using T = __nv_bfloat16;
  const int64_t H = 2048, E = 32, k = 4, I = 7168, P = n * k;
  float* x = rand_dev<float>(n * H, 11, 3.f);
  float* nw = rand_dev<float>(H, 12, 1.f);
  T* y = dev_alloc<T>(n * H);
  T* delta = rand_dev<T>(n * H, 13, 1.f);
  T* gu = rand_dev<T>(n * 2 * I, 14, 1.f);
  T* act = dev_alloc<T>(n * I);
  T* gate = rand_dev<T>(E * H, 17, 0.05f);
  float* logits = rand_dev<float>(n * E, 15, 3.f);
  float* wts = dev_alloc<float>(P);
  int32_t *ids = dev_alloc<int32_t>(P), *off = dev_alloc<int32_t>(E + 1), *src = dev_alloc<int32_t>(P),
          *dest = dev_alloc<int32_t>(P), *pscr = dev_alloc<int32_t>(cuda::moe_permute_scratch_ints(n, E, k));
  float* yexp = rand_dev<float>(P * H, 16, 1.f);
  cuda::moe_router(wts, ids, logits, nullptr, n, E, k, true, 1.f, s);
  cuda::moe_permute(off, src, dest, ids, n, E, k, pscr, s);
  const double t_norm = median_ms(s, [&] { cuda::rmsnorm(y, x, nw, n, H, 1e-5f, s); });
  const double t_addnorm = median_ms(s, [&] { cuda::add_rmsnorm(y, x, delta, nw, n, H, 1e-5f, s); });
  const double t_swiglu = median_ms(s, [&] { cuda::swiglu(act, gu, n, I, s); });
  const double t_logits = median_ms(s, [&] { cuda::linear_f32out_decode(logits, delta, gate, n, H, E, s); });
  const double t_router = median_ms(s, [&] { cuda::moe_router(wts, ids, logits, nullptr, n, E, k, true, 1.f, s); });
  const double t_router_drop =
      median_ms(s, [&] { cuda::moe_router_drop(wts, ids, logits, nullptr, nullptr, n, E, k, true, 1.f, s); });
  const double t_perm = median_ms(s, [&] { cuda::moe_permute(off, src, dest, ids, n, E, k, pscr, s); });
  const double t_perm1 = median_ms(s, [&] { cuda::moe_permute_one_block(off, src, dest, ids, n, E, k, s); });
  const double t_route = median_ms(
      s, [&] { cuda::moe_route_decode(wts, ids, off, src, dest, delta, gate, nullptr, nullptr, n, H, E, k, true, 1.f, s); });
  const double t_comb = median_ms(s, [&] { cuda::moe_combine(x, yexp, dest, wts, n, k, H, s); });
  const double t_comb_norm =
      median_ms(s, [&] { cuda::moe_combine_rmsnorm(y, x, yexp, dest, wts, nw, n, k, H, 1e-5f, s); });
  std::printf("bf16  small kernels %3lld rows (ms): rmsnorm %.4f | add_rmsnorm %.4f | swiglu(7168) %.4f | router "
              "logits (decode path) %.4f | moe_router %.4f | router+drop %.4f | permute (3 launches) %.4f | permute "
              "one block %.4f | fused decode router (logits+top-k+drop+permute) %.4f | combine (fp32 rows) %.4f | "
              "combine + next rmsnorm %.4f\n",
              (long long)n, t_norm, t_addnorm, t_swiglu, t_logits, t_router, t_router_drop, t_perm, t_perm1, t_route,
              t_comb, t_comb_norm);
  for (void* p : std::initializer_list<void*>{x, nw, y, delta, gu, act, gate, logits, wts, ids, off, src, dest, pscr,
                                              yexp})
    cudaFree(p);
}

// "8,32,256" into tokens (each 1..4096); false, with one line on stderr, for anything else.
bool parse_tokens(const char* arg, std::vector<int64_t>& tokens) {
  tokens.clear();
  std::stringstream list(arg);
  for (std::string t; std::getline(list, t, ',');) {
    const int64_t n = std::atoll(t.c_str());
    if (n < 1 || n > 4096 || std::to_string(n) != t) {
      std::fprintf(stderr, "cuda_bench_decode: token count '%s' in '%s' (1..4096, comma-separated)\n", t.c_str(), arg);
      return false;
    }
    tokens.push_back(n);
  }
  if (tokens.empty()) std::fprintf(stderr, "cuda_bench_decode: no token counts in '%s'\n", arg);
  return !tokens.empty();
}

}  // namespace
}  // namespace lfm2

int main(int argc, char** argv) {
  using namespace lfm2;
  const std::string mode = argc > 1 ? argv[1] : "all";
  // a token list (e.g. for ncu: the first launches are then that size's)
  std::vector<int64_t> tokens{8, 32, 64, 128, 256};
  if (argc > 2 && !parse_tokens(argv[2], tokens)) return 2;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  bench_copy(s);
  if (mode == "all" || mode == "moe") {
    for (int64_t t : tokens) bench_moe<__nv_bfloat16>("bf16", s, t, true);
    if (argc <= 2) bench_moe<__half>("fp16", s, 32, false);
  }
  if (mode == "all" || mode == "proj") bench_projections(s);
  if (mode == "all" || mode == "small")
    for (int64_t t : {32, 256}) bench_small(s, t);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
