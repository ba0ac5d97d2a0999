// Timings of the paged-cache kernels on the GPU at LFM2-8B-A1B's attention shapes (32 heads, 8 KV
// heads, head_dim 64, bf16; not a test, run by hand):
//   cuda_bench_attention_paged [decode|store|prefill|fp8]   (default: all four)
// decode:  flash-decoding at batch x cache length, pages of 16 shuffled (and of 256, and one
//          contiguous run), effective TB/s = K and V bytes read / time.
// store:   the fused norm + RoPE + paged store (beside qk_norm_rope alone on the same rows).
// prefill: chunked prefill at a few (chunks x rows at first_pos) vs attention() on whole prompts.
// fp8:     the fp8 cache (--kv-dtype fp8): decode at batch x length beside the bf16 cache (bytes: e4m3
//          K and V plus their fp32 scales), the fp8 store and the fp8 prefill.
// CUDA events around back-to-back launches, warm-up first, median of 5 batches' means.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/rng.h"
#include "kernels/cuda/ops.h"
#include "bench_util.h"

namespace lfm2 {
namespace {

using T = __nv_bfloat16;
constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 64, kWidth = (kHeads + 2 * kKvHeads) * kHeadDim;
constexpr int64_t kKv = kKvHeads * kHeadDim;

using bench::dev_alloc;
using bench::median_ms;

// n random bf16 values in (-scale, scale): 4M generated on the host, repeated to fill.
T* rand_dev(int64_t n, uint64_t seed, float scale) {
  const int64_t m = std::min<int64_t>(n, int64_t(1) << 22);
  std::vector<float> h(static_cast<size_t>(m));
  CounterRng rng(77, seed);
  for (int64_t i = 0; i < m; ++i) h[size_t(i)] = float(rng.symmetric(uint64_t(i))) * scale;
  float* tmp = dev_alloc<float>(m);
  T* d = dev_alloc<T>(n);
  CUDA_CHECK(cudaMemcpy(tmp, h.data(), size_t(m) * 4, cudaMemcpyHostToDevice));
  cuda::convert_from_f32(d, tmp, m, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t off = m; off < n; off += m)
    CUDA_CHECK(cudaMemcpy(d + off, d, size_t(std::min(m, n - off)) * sizeof(T), cudaMemcpyDeviceToDevice));
  cudaFree(tmp);
  return d;
}

template <typename E>
E* upload(const std::vector<E>& h) {
  E* d = dev_alloc<E>(int64_t(h.size()));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
  return d;
}

// n e4m3 bytes of finite values (exponent field <= 7: |x| <= 1.875, random signs), repeated to fill.
uint8_t* rand_e4m3(int64_t n, uint64_t seed) {
  const int64_t m = std::min<int64_t>(n, int64_t(1) << 22);
  std::vector<uint8_t> h(static_cast<size_t>(m));
  CounterRng rng(78, seed);
  for (int64_t i = 0; i < m; ++i) h[size_t(i)] = uint8_t(uint64_t((rng.symmetric(uint64_t(i)) + 1.0) * 1e6) & 0xbf);
  uint8_t* d = dev_alloc<uint8_t>(n);
  for (int64_t off = 0; off < n; off += m)
    CUDA_CHECK(cudaMemcpy(d + off, h.data(), size_t(std::min(m, n - off)), cudaMemcpyHostToDevice));
  return d;
}

// Block table of n sequences x max_pages over pages 0..n*max_pages-1: in order (contiguous runs)
// or shuffled.
std::vector<int32_t> make_table(int64_t n, int64_t max_pages, bool shuffled) {
  std::vector<int32_t> t(static_cast<size_t>(n * max_pages));
  std::iota(t.begin(), t.end(), 0);
  if (shuffled) std::shuffle(t.begin(), t.end(), std::mt19937(5));
  return t;
}

// The same launches captured once in a CUDA Graph and replayed (as the stage's decode steps run):
// the time, and whether the replay writes the direct launch's bits.
void bench_graph(cudaStream_t s, T* out, int64_t n_out, double bytes, const std::function<void()>& f) {
  std::vector<T> direct(static_cast<size_t>(n_out)), replay(direct.size());
  f();
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaMemcpy(direct.data(), out, direct.size() * sizeof(T), cudaMemcpyDeviceToHost));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  f();
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  CUDA_CHECK(cudaMemsetAsync(out, 0, direct.size() * sizeof(T), s));
  CUDA_CHECK(cudaGraphLaunch(ge, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaMemcpy(replay.data(), out, replay.size() * sizeof(T), cudaMemcpyDeviceToHost));
  const bool same = std::memcmp(direct.data(), replay.data(), direct.size() * sizeof(T)) == 0;
  const double t = median_ms(s, [&] { CUDA_CHECK(cudaGraphLaunch(ge, s)); }, 20);
  std::printf("decode paged    (the above, replayed from a CUDA Graph) %8.1f us  %5.2f TB/s, %s bits\n", t * 1e3,
              bytes / t * 1e-9, same ? "the same" : "DIFFERENT");
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
}

void bench_decode(cudaStream_t s, int64_t B, int64_t L) {
  const int64_t n_pos = B * L;
  T* k = rand_dev(n_pos * kKv, 1, 1.f);
  T* v = rand_dev(n_pos * kKv, 2, 1.f);
  T* qkv = rand_dev(B * kWidth, 3, 1.f);
  T* out = dev_alloc<T>(B * kHeads * kHeadDim);
  std::vector<PagedSeq> seqs;
  for (int64_t i = 0; i < B; ++i) seqs.push_back({int32_t(i), 1, int32_t(L - 1), int32_t(i)});
  PagedSeq* d_seqs = upload(seqs);
  const double bytes = 2.0 * double(n_pos) * kKv * sizeof(T);
  const int reps = L >= 8192 ? 20 : 50;
  for (auto [ps, shuffled] : {std::pair<int64_t, bool>{16, true}, {256, true}, {16, false}}) {
    const int64_t max_pages = L / ps;
    int32_t* table = upload(make_table(B, max_pages, shuffled));
    void* ws = dev_alloc<char>(cuda::attention_decode_paged_workspace_bytes(B, kHeads, kHeadDim, L));
    const double t = median_ms(s, [&] {
      cuda::attention_decode_paged(out, qkv, k, v, d_seqs, B, table, max_pages, ps, kHeads, kKvHeads, kHeadDim, 0.125f,
                                   ws, s, kWidth);
    }, reps);
    std::printf("decode paged  %4lld x %-6lld page %3lld %-10s %8.1f us  %5.2f TB/s\n", (long long)B, (long long)L,
                (long long)ps, shuffled ? "shuffled" : "contiguous", t * 1e3, bytes / t * 1e-9);
    if (ps == 16 && shuffled) bench_graph(s, out, B * kHeads * kHeadDim, bytes, [&] {
      cuda::attention_decode_paged(out, qkv, k, v, d_seqs, B, table, max_pages, ps, kHeads, kKvHeads, kHeadDim, 0.125f,
                                   ws, s, kWidth);
    });
    cudaFree(table), cudaFree(ws);
  }
  cudaFree(k), cudaFree(v), cudaFree(qkv), cudaFree(out), cudaFree(d_seqs);
}

// The fp8 cache at B x L, pages of 16 shuffled: decode beside the bf16 cache's (the same q), the
// effective rate over the bytes each reads.
void bench_decode_fp8(cudaStream_t s, int64_t B, int64_t L) {
  const int64_t n_pos = B * L, ps = 16, max_pages = L / ps;
  T* k = rand_dev(n_pos * kKv, 1, 1.f);
  T* v = rand_dev(n_pos * kKv, 2, 1.f);
  uint8_t* k8 = rand_e4m3(n_pos * kKv, 11);
  uint8_t* v8 = rand_e4m3(n_pos * kKv, 12);
  float* ks = upload(std::vector<float>(size_t(n_pos * kKvHeads), 0.01f));
  float* vs = upload(std::vector<float>(size_t(n_pos * kKvHeads), 0.02f));
  T* qkv = rand_dev(B * kWidth, 3, 1.f);
  T* out = dev_alloc<T>(B * kHeads * kHeadDim);
  std::vector<PagedSeq> seqs;
  for (int64_t i = 0; i < B; ++i) seqs.push_back({int32_t(i), 1, int32_t(L - 1), int32_t(i)});
  PagedSeq* d_seqs = upload(seqs);
  int32_t* table = upload(make_table(B, max_pages, true));
  void* ws = dev_alloc<char>(cuda::attention_decode_paged_workspace_bytes(B, kHeads, kHeadDim, L));
  const int reps = L >= 8192 ? 20 : 50;
  const double b16 = 2.0 * double(n_pos) * kKv * sizeof(T), b8 = 2.0 * double(n_pos) * kKvHeads * (kHeadDim + 4);
  const double t16 = median_ms(s, [&] {
    cuda::attention_decode_paged(out, qkv, k, v, d_seqs, B, table, max_pages, ps, kHeads, kKvHeads, kHeadDim, 0.125f,
                                 ws, s, kWidth);
  }, reps);
  const double t8 = median_ms(s, [&] {
    cuda::attention_decode_paged_fp8(out, qkv, k8, v8, ks, vs, d_seqs, B, table, max_pages, ps, kHeads, kKvHeads,
                                     kHeadDim, 0.125f, ws, s, kWidth);
  }, reps);
  std::printf("decode fp8    %4lld x %-6lld page  16 shuffled: bf16 cache %8.1f us %5.2f TB/s (%6.1f MB) | fp8 cache "
              "%8.1f us %5.2f TB/s (%6.1f MB) | %.2fx\n",
              (long long)B, (long long)L, t16 * 1e3, b16 / t16 * 1e-9, b16 * 1e-6, t8 * 1e3, b8 / t8 * 1e-9, b8 * 1e-6,
              t16 / t8);
  cudaFree(k), cudaFree(v), cudaFree(k8), cudaFree(v8), cudaFree(ks), cudaFree(vs), cudaFree(qkv), cudaFree(out);
  cudaFree(d_seqs), cudaFree(table), cudaFree(ws);
}

// The fp8 store at n_rows decode rows and the fp8 prefill of n_chunks x n_rows at first_pos.
void bench_fp8_store_prefill(cudaStream_t s, int64_t n_chunks, int64_t n_rows, int64_t first_pos) {
  const int64_t ps = 16, len = first_pos + n_rows, max_pages = (len + ps - 1) / ps, n_pos = n_chunks * max_pages * ps;
  T* qkv = rand_dev(n_chunks * n_rows * kWidth, 5, 1.f);
  T* k = rand_dev(n_pos * kKv, 6, 1.f);
  T* v = rand_dev(n_pos * kKv, 7, 1.f);
  uint8_t* k8 = rand_e4m3(n_pos * kKv, 13);
  uint8_t* v8 = rand_e4m3(n_pos * kKv, 14);
  float* ks = upload(std::vector<float>(size_t(n_pos * kKvHeads), 0.01f));
  float* vs = upload(std::vector<float>(size_t(n_pos * kKvHeads), 0.02f));
  float* norm = upload(std::vector<float>(size_t(kHeadDim), 1.f));
  float* inv = upload(std::vector<float>(size_t(kHeadDim / 2), 0.01f));
  T* out = dev_alloc<T>(n_chunks * n_rows * kHeads * kHeadDim);
  std::vector<PagedSeq> seqs;
  for (int64_t i = 0; i < n_chunks; ++i)
    seqs.push_back({int32_t(i * n_rows), int32_t(n_rows), int32_t(first_pos), int32_t(i)});
  PagedSeq* d_seqs = upload(seqs);
  int32_t* table = upload(make_table(n_chunks, max_pages, true));
  const double t16 = median_ms(s, [&] {
    cuda::attention_prefill_paged(out, qkv, k, v, d_seqs, n_chunks, n_rows, table, max_pages, ps, kHeads, kKvHeads,
                                  kHeadDim, 0.125f, s, kWidth);
  }, 10);
  const double t8 = median_ms(s, [&] {
    cuda::attention_prefill_paged_fp8(out, qkv, k8, v8, ks, vs, d_seqs, n_chunks, n_rows, table, max_pages, ps, kHeads,
                                      kKvHeads, kHeadDim, 0.125f, s, kWidth);
  }, 10);
  const double st16 = median_ms(s, [&] {
    cuda::qk_norm_rope_store(qkv, k, v, norm, norm, inv, d_seqs, n_chunks, n_chunks * n_rows, table, max_pages, ps,
                             kHeads, kKvHeads, kHeadDim, 1e-5f, s);
  }, 20);
  const double st8 = median_ms(s, [&] {
    cuda::qk_norm_rope_store_fp8(qkv, k8, v8, ks, vs, norm, norm, inv, d_seqs, n_chunks, n_chunks * n_rows, table,
                                 max_pages, ps, kHeads, kKvHeads, kHeadDim, 1e-5f, s);
  }, 20);
  std::printf("prefill fp8   %3lld x %5lld rows at %5lld: bf16 cache %8.1f us | fp8 cache %8.1f us | store bf16 %7.1f us"
              " fp8 %7.1f us\n",
              (long long)n_chunks, (long long)n_rows, (long long)first_pos, t16 * 1e3, t8 * 1e3, st16 * 1e3,
              st8 * 1e3);
  cudaFree(qkv), cudaFree(k), cudaFree(v), cudaFree(k8), cudaFree(v8), cudaFree(ks), cudaFree(vs), cudaFree(norm);
  cudaFree(inv), cudaFree(out), cudaFree(d_seqs), cudaFree(table);
}

// The attention layer's prologue at n_rows rows (decode rows of n_rows sequences, or one chunk).
void bench_store(cudaStream_t s, int64_t n_rows, bool chunk) {
  const int64_t ps = 16, max_len = chunk ? 8192 : 4096, n_seqs = chunk ? 1 : n_rows, max_pages = max_len / ps;
  T* qkv = rand_dev(n_rows * kWidth, 4, 1.f);
  T* k = dev_alloc<T>(n_seqs * max_len * kKv);
  T* v = dev_alloc<T>(n_seqs * max_len * kKv);
  float* norm = upload(std::vector<float>(size_t(kHeadDim), 1.f));
  float* inv = upload(std::vector<float>(size_t(kHeadDim / 2), 0.01f));
  std::vector<PagedSeq> seqs;
  for (int64_t i = 0; i < n_seqs; ++i)
    seqs.push_back(chunk ? PagedSeq{0, int32_t(n_rows), 0, 0} : PagedSeq{int32_t(i), 1, 4000, int32_t(i)});
  PagedSeq* d_seqs = upload(seqs);
  int32_t* table = upload(make_table(n_seqs, max_pages, true));
  const double t_new = median_ms(s, [&] {
    cuda::qk_norm_rope_store(qkv, k, v, norm, norm, inv, d_seqs, n_seqs, n_rows, table, max_pages, ps, kHeads,
                             kKvHeads, kHeadDim, 1e-5f, s);
  }, 50);
  const double t_rope = median_ms(s, [&] {
    cuda::qk_norm_rope(qkv, norm, norm, inv, chunk ? 1 : n_rows, chunk ? n_rows : 1, kHeads, kKvHeads, kHeadDim, 1e-5f,
                       s);
  }, 50);
  std::printf("store %5lld %-7s rows: fused norm+rope+paged store %7.1f us | qk_norm_rope alone %7.1f us\n",
              (long long)n_rows, chunk ? "chunk" : "decode", t_new * 1e3, t_rope * 1e3);
  cudaFree(qkv), cudaFree(k), cudaFree(v), cudaFree(norm), cudaFree(inv), cudaFree(d_seqs), cudaFree(table);
}

// n_chunks sequences, each a chunk of n_rows queries at first_pos, over caches of first_pos + n_rows.
void bench_prefill(cudaStream_t s, int64_t n_chunks, int64_t n_rows, int64_t first_pos) {
  const int64_t ps = 16, len = first_pos + n_rows, max_pages = (len + ps - 1) / ps;
  T* qkv = rand_dev(n_chunks * n_rows * kWidth, 5, 1.f);
  T* k = rand_dev(n_chunks * max_pages * ps * kKv, 6, 1.f);
  T* v = rand_dev(n_chunks * max_pages * ps * kKv, 7, 1.f);
  T* out = dev_alloc<T>(n_chunks * n_rows * kHeads * kHeadDim);
  std::vector<PagedSeq> seqs;
  for (int64_t i = 0; i < n_chunks; ++i)
    seqs.push_back({int32_t(i * n_rows), int32_t(n_rows), int32_t(first_pos), int32_t(i)});
  PagedSeq* d_seqs = upload(seqs);
  int32_t* table = upload(make_table(n_chunks, max_pages, true));
  const double t = median_ms(s, [&] {
    cuda::attention_prefill_paged(out, qkv, k, v, d_seqs, n_chunks, n_rows, table, max_pages, ps, kHeads, kKvHeads,
                                  kHeadDim, 0.125f, s, kWidth);
  }, 10);
  // q.k and p.v over each query's visible keys
  const double flops = 4.0 * n_chunks * kHeads * kHeadDim * (double(n_rows) * first_pos + n_rows * (n_rows + 1) / 2.0);
  std::printf("prefill paged %3lld x %5lld rows at %5lld: %8.1f us %4.0f TFLOP/s", (long long)n_chunks,
              (long long)n_rows, (long long)first_pos, t * 1e3, flops / t * 1e-9);
  if (first_pos == 0) {
    const double t_old = median_ms(s, [&] {
      cuda::attention(out, qkv, qkv + kHeads * kHeadDim, qkv + (kHeads + kKvHeads) * kHeadDim, n_chunks, n_rows, kHeads,
                      kKvHeads, kHeadDim, 0.125f, s, kWidth, kWidth);
    }, 10);
    std::printf(" | attention() whole prompts %8.1f us %4.0f TFLOP/s", t_old * 1e3, flops / t_old * 1e-9);
  }
  std::printf("\n");
  cudaFree(qkv), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(d_seqs), cudaFree(table);
}

}  // namespace
}  // namespace lfm2

int main(int argc, char** argv) {
  using namespace lfm2;
  const std::string mode = argc > 1 ? argv[1] : "all";
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; 32 heads, 8 KV heads, head_dim 64, bf16\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (mode == "all" || mode == "decode") {
    bench_decode(s, 32, 10240);
    bench_decode(s, 32, 8192);
    bench_decode(s, 256, 1024);
    bench_decode(s, 32, 1024);
    bench_decode(s, 8, 32768);
  }
  if (mode == "all" || mode == "store") {
    for (int64_t r : {32, 256}) bench_store(s, r, false);
    bench_store(s, 8192, true);
  }
  if (mode == "all" || mode == "prefill") {
    bench_prefill(s, 4, 2048, 0);
    bench_prefill(s, 1, 8192, 0);
    bench_prefill(s, 1, 2048, 6144);
    bench_prefill(s, 16, 512, 7680);
    bench_prefill(s, 32, 64, 8192);
  }
  if (mode == "all" || mode == "fp8") {
    bench_decode_fp8(s, 32, 10240);
    bench_decode_fp8(s, 32, 8192);
    bench_decode_fp8(s, 256, 1024);
    bench_decode_fp8(s, 8, 32768);
    bench_fp8_store_prefill(s, 32, 1, 8192);
    bench_fp8_store_prefill(s, 1, 8192, 0);
    bench_fp8_store_prefill(s, 16, 512, 7680);
  }
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
