// Kernel timings on the GPU at LFM2-8B-A1B shapes (not a test; run by hand or by the GPU check):
// the MoE grouped GEMMs and the whole routed-experts path, a cuBLAS GEMM for comparison, the fused
// attention and the permutation. CUDA events around each launch, warm-up first, median of reps.
// Prints one line per kernel: time, and TFLOP/s or GB/s against the work counted.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/rng.h"
#include "kernels/cuda/ops.h"

namespace lfm2 {
namespace {

double median_ms(cudaStream_t s, const std::function<void()>& f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, s));
    f();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
T* rand_dev(int64_t n, uint64_t seed, float scale) {
  std::vector<float> h(static_cast<size_t>(n));
  CounterRng rng(99, seed);
  for (int64_t i = 0; i < n; ++i) h[i] = float(rng.symmetric(uint64_t(i))) * scale;
  float* tmp;
  T* d;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&tmp), size_t(n) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), size_t(n) * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(tmp, h.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  cuda::convert_from_f32(d, tmp, n, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(tmp);
  return d;
}

template <typename T>
void bench_moe(const char* name, cudaStream_t s, int64_t n_tokens) {
  const int64_t H = 2048, E = 32, Im = 1792, k = 4, P = n_tokens * k;
  T* in = rand_dev<T>(n_tokens * H, 1, 1.f);
  T* w13 = rand_dev<T>(E * 2 * Im * H, 2, 0.02f);
  T* w2 = rand_dev<T>(E * H * Im, 3, 0.02f);
  float* logits = rand_dev<float>(n_tokens * E, 4, 3.f);
  float *x, *wts;
  int32_t *ids, *off, *src, *dest, *pscr;
  T *gu, *act, *y;
  void* scratch;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), size_t(n_tokens * H) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&wts), size_t(P) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids), size_t(P) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&off), size_t(E + 1) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&src), size_t(P) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dest), size_t(P) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&pscr), size_t(cuda::moe_permute_scratch_ints(n_tokens, E, k)) * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&gu), size_t(P * 2 * Im) * sizeof(T)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&act), size_t(P * Im) * sizeof(T)));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&y), size_t(P * H) * sizeof(T)));
  CUDA_CHECK(cudaMalloc(&scratch, size_t(cuda::moe_experts_scratch_bytes(n_tokens, H, E, Im, k, sizeof(T)))));
  CUDA_CHECK(cudaMemset(x, 0, size_t(n_tokens * H) * 4));
  cuda::moe_router(wts, ids, logits, nullptr, n_tokens, E, k, true, 1.f, s);
  cuda::moe_permute(off, src, dest, ids, n_tokens, E, k, pscr, s);
  const double f1 = 2.0 * P * 2 * Im * H, f2 = 2.0 * P * H * Im;
  const double t_perm = median_ms(s, [&] { cuda::moe_permute(off, src, dest, ids, n_tokens, E, k, pscr, s); });
  const double t1 = median_ms(s, [&] { cuda::moe_grouped_matmul(gu, in, src, w13, off, P, E, H, 2 * Im, s); });
  const double t2 = median_ms(s, [&] { cuda::moe_grouped_matmul(y, act, static_cast<const int32_t*>(nullptr), w2, off, P, E, Im, H, s); });
  const double tall = median_ms(s, [&] {
    cuda::moe_router(wts, ids, logits, nullptr, n_tokens, E, k, true, 1.f, s);
    cuda::moe_experts(x, in, w13, w2, ids, wts, n_tokens, H, E, Im, k, scratch, s);
  });
  std::printf("%-5s moe %6lld tok: permute %.3f ms | gate_up GEMM %.3f ms %.0f TFLOP/s | down GEMM %.3f ms %.0f TFLOP/s"
              " | route+experts %.3f ms %.0f TFLOP/s\n",
              name, (long long)n_tokens, t_perm, t1, f1 / t1 * 1e-9, t2, f2 / t2 * 1e-9, tall, (f1 + f2) / tall * 1e-9);
  for (void* p : std::initializer_list<void*>{in, w13, w2, logits, x, wts, ids, off, src, dest, pscr, gu, act, y, scratch})
    cudaFree(p);
}

template <typename T>
void bench_linear(const char* name, cudaStream_t s, int64_t M, int64_t K, int64_t N) {
  T* a = rand_dev<T>(M * K, 5, 1.f);
  T* w = rand_dev<T>(N * K, 6, 0.02f);
  T* o;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), size_t(M * N) * sizeof(T)));
  const double t = median_ms(s, [&] { cuda::linear(o, a, w, M, K, N, s); });
  std::printf("%-5s cuBLAS linear %lldx%lldx%lld: %.3f ms %.0f TFLOP/s\n", name, (long long)M, (long long)K,
              (long long)N, t, 2.0 * M * N * K / t * 1e-9);
  cudaFree(a), cudaFree(w), cudaFree(o);
}

template <typename T>
void bench_attention(const char* name, cudaStream_t s, int64_t n_seq, int64_t S) {
  const int64_t nh = 32, nkv = 8, hd = 64, width = (nh + 2 * nkv) * hd, n = n_seq * S;
  T* qkv = rand_dev<T>(n * width, 7, 1.f);
  T* o;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), size_t(n * nh * hd) * sizeof(T)));
  const double t = median_ms(s, [&] {
    cuda::attention(o, qkv, qkv + nh * hd, qkv + (nh + nkv) * hd, n_seq, S, nh, nkv, hd, 0.125f, s, width, width);
  });
  const double flops = 4.0 * n_seq * nh * hd * (S * (S + 1) / 2.0);  // qk and pv, causal
  std::printf("%-5s attention %lld x %lld (32/8 heads, hd 64): %.3f ms %.1f TFLOP/s\n", name, (long long)n_seq,
              (long long)S, t, flops / t * 1e-9);
  cudaFree(qkv), cudaFree(o);
}

}  // namespace
}  // namespace lfm2

int main(int argc, char** argv) {
  const bool moe_only = argc > 1 && std::string(argv[1]) == "moe";  // grouped-GEMM variant sweeps
  using namespace lfm2;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  if (!moe_only) {
    bench_linear<__nv_bfloat16>("bf16", s, 32768, 2048, 2048);
    bench_linear<float>("fp32", s, 32768, 2048, 2048);
  }
  for (int64_t t : {1024, 4096, 16384}) bench_moe<__nv_bfloat16>("bf16", s, t);
  bench_moe<__half>("fp16", s, 4096);
  bench_moe<float>("fp32", s, 4096);
  if (moe_only) return 0;
  bench_attention<__nv_bfloat16>("bf16", s, 1024, 32);
  bench_attention<float>("fp32", s, 1024, 32);
  bench_attention<__nv_bfloat16>("bf16", s, 2, 8192);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
