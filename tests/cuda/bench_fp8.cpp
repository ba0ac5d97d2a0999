// FP8 decode products beside the bf16 ones at LFM2-8B-A1B shapes (not a test; run by hand on a GPU
// machine): cuda_bench_fp8 [moe rows,... [projection rows,...]] (default 8,32,64,128,256 for both;
// moe rows 0: no MoE).
//  - one MoE layer (top-4 of 32, hidden 2048, moe 1792, random inputs and router): the bf16
//    moe_experts_decode and moe_experts_decode_fp8 under both schemes (FP8 x FP8, its routed entry,
//    each piece alone, the widening products, token tiles forced; bf16 and the routed entry also over
//    8 copies of the weights in turn, as a step meets each layer's cold), the same routing; effective
//    bandwidth = the bytes that must move (touched experts' weights once, their scales, the tokens)
//    over the time, and that against the device-to-device copy bandwidth measured first.
//  - the projections of a decode step (qkv, attention/conv out, conv in, dense w13, dense w2) at the
//    same rows: linear_decode (bf16, the pinned path) beside linear_fp8_decode.
// CUDA events around batches of calls queued back to back, warm-up first, median of 5 batches.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/fp8.h"
#include "common/rng.h"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/fp8_tuning.h"
#include "kernels/cuda/ops.h"
#include "bench_util.h"

namespace lfm2 {
namespace {

using namespace bench;

// A stack of n_mat (rows, cols) random matrices quantized on the host: e4m3 and scales on the device.
struct DevQ8 {
  uint8_t* q = nullptr;
  float* s = nullptr;
  int64_t scale_count = 0;
  int64_t q_bytes = 0;
};
DevQ8 rand_fp8(int64_t n_mat, int64_t rows, int64_t cols, Fp8Scheme scheme, uint64_t seed, float scale) {
  const auto w = rand_host(n_mat * rows * cols, seed, scale);
  const int64_t per = fp8_scale_rows(scheme, rows) * fp8_scale_cols(scheme, cols);
  std::vector<uint8_t> q(w.size());
  std::vector<float> s(size_t(n_mat * per));
  for (int64_t b = 0; b < n_mat; ++b)
    fp8_quantize(q.data() + b * rows * cols, s.data() + b * per, w.data() + b * rows * cols, rows, cols, scheme);
  return {upload(q), upload(s), int64_t(s.size()), int64_t(q.size())};
}

constexpr int kLayers = 8;  // weight copies read in turn ("8 layers" lines)

DevQ8 copy_of(const DevQ8& d) {
  DevQ8 c{dev_alloc<uint8_t>(d.q_bytes), dev_alloc<float>(d.scale_count), d.scale_count, d.q_bytes};
  CUDA_CHECK(cudaMemcpy(c.q, d.q, size_t(d.q_bytes), cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(c.s, d.s, size_t(d.scale_count) * 4, cudaMemcpyDeviceToDevice));
  return c;
}

// One token count's routing and buffers; the weights are made once (quantizing them takes seconds).
struct MoeCase {
  int64_t n, P;
  double touched, act;
  __nv_bfloat16 *y, *normed;
  float *x, *logits, *wts, *norm;
  int32_t* ids;
  void* scratch;
};
constexpr int64_t kH = 2048, kE = 32, kI = 1792, kTopK = 4;

MoeCase moe_case(cudaStream_t s, int64_t n, const __nv_bfloat16* wg) {
  using T = __nv_bfloat16;
  MoeCase c{n, n * kTopK, 0, double(n) * kH * (sizeof(T) + 8), rand_dev<T>(n * kH, 1, 1.f),
            dev_alloc<T>(n * kH),
            upload(rand_host(n * kH, 5, 1.f)), dev_alloc<float>(n * kE), dev_alloc<float>(n * kTopK),
            upload(rand_host(kH, 6, 1.f)), dev_alloc<int32_t>(n * kTopK), dev_alloc<char>(std::max(
                cuda::moe_experts_decode_scratch_bytes(n, kH, kE, kI, kTopK, sizeof(T)),
                cuda::moe_experts_decode_fp8_scratch_bytes(n, kH, kE, kI, kTopK, sizeof(T))))};
  cuda::linear_f32out(c.logits, c.y, wg, n, kH, kE, s);
  cuda::moe_router_drop(c.wts, c.ids, c.logits, nullptr, nullptr, n, kE, kTopK, true, 1.f, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<int32_t> h(static_cast<size_t>(c.P));
  CUDA_CHECK(cudaMemcpy(h.data(), c.ids, size_t(c.P) * 4, cudaMemcpyDeviceToHost));
  std::vector<bool> used(size_t(kE), false);
  for (int32_t e : h) used[size_t(e)] = true;
  c.touched = double(std::count(used.begin(), used.end(), true));
  return c;
}

// bf16's experts_decode per case: the baseline of the fp8 lines.
std::vector<double> bench_moe_bf16(cudaStream_t s, const std::vector<MoeCase>& cases) {
  using T = __nv_bfloat16;
  T* w13 = rand_dev<__nv_bfloat16>(kE * 2 * kI * kH, 2, 0.02f);
  T* w2 = rand_dev<__nv_bfloat16>(kE * kH * kI, 3, 0.02f);
  std::vector<T*> w13s, w2s;  // kLayers copies read in turn
  for (int l = 0; l < kLayers; ++l) {
    w13s.push_back(dev_alloc<T>(kE * 2 * kI * kH)), w2s.push_back(dev_alloc<T>(kE * kH * kI));
    CUDA_CHECK(cudaMemcpy(w13s.back(), w13, size_t(kE * 2 * kI * kH) * sizeof(T), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(w2s.back(), w2, size_t(kE * kH * kI) * sizeof(T), cudaMemcpyDeviceToDevice));
  }
  int turn = 0;
  std::vector<double> t16(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const MoeCase& c = cases[i];
    t16[i] = median_ms(s, [&] {
      cuda::moe_experts_decode(c.x, c.y, w13, w2, c.ids, c.wts, c.n, kH, kE, kI, kTopK, c.scratch, s);
    });
    std::printf("moe %4lld tok (%2.0f experts)  bf16 experts_decode      %s\n", (long long)c.n, c.touched,
                bw(c.touched * 3 * kI * kH * 2 + c.act, t16[i]).c_str());
    const double t8 = median_ms(s, [&] {
      const int l = turn++ % kLayers;
      cuda::moe_experts_decode(c.x, c.y, w13s[size_t(l)], w2s[size_t(l)], c.ids, c.wts, c.n, kH, kE, kI, kTopK,
                               c.scratch, s);
    });
    std::printf("moe %4lld tok (%2.0f experts)  bf16 8 layers in turn    %s\n", (long long)c.n, c.touched,
                bw(c.touched * 3 * kI * kH * 2 + c.act, t8).c_str());
  }
  cudaFree(w13), cudaFree(w2);
  for (int l = 0; l < kLayers; ++l) cudaFree(w13s[size_t(l)]), cudaFree(w2s[size_t(l)]);
  return t16;
}

// The stage's entry: the router's permutation (here moe_permute_one_block's, made once), the
// products, the combine with the next norm; and the permutation and the combine alone.
template <class Line>
void bench_moe_fp8_routed(cudaStream_t s, const MoeCase& c, const DevQ8& q13, const DevQ8& q2, Fp8Scheme scheme,
                          const Line& line) {
  const int64_t E = kE, k = kTopK;
  auto align = [](int64_t b) { return (b + 255) / 256 * 256; };  // moe_experts_decode's scratch layout
  char* base = static_cast<char*>(c.scratch);
  auto* off = reinterpret_cast<int32_t*>(base);
  auto* src = reinterpret_cast<int32_t*>(base + align((E + 1) * 4));
  auto* dest = reinterpret_cast<int32_t*>(base + align((E + 1) * 4) + align(c.P * 4));
  void* rest = base + align((E + 1) * 4) + 2 * align(c.P * 4);
  cuda::moe_permute_one_block(off, src, dest, c.ids, c.n, E, k, s);
  line("routed", median_ms(s, [&] {
         cuda::moe_experts_decode_fp8_routed(c.x, c.normed, c.y, q13.q, q13.s, q2.q, q2.s, scheme, off, src, dest,
                                             c.wts, c.norm, 1e-5f, c.n, kH, E, kI, k, rest, s);
       }));
  // the same over kLayers copies of the weights in turn, as a step reads 22 layers' (none in L2 or a
  // TLB from the call before)
  std::vector<DevQ8> w13s, w2s;
  for (int i = 0; i < kLayers; ++i) w13s.push_back(copy_of(q13)), w2s.push_back(copy_of(q2));
  int turn = 0;
  line("routed, 8 layers", median_ms(s, [&] {
         const int i = turn++ % kLayers;
         cuda::moe_experts_decode_fp8_routed(c.x, c.normed, c.y, w13s[i].q, w13s[i].s, w2s[i].q, w2s[i].s, scheme,
                                             off, src, dest, c.wts, c.norm, 1e-5f, c.n, kH, E, kI, k, rest, s);
       }));
  for (DevQ8& d : w13s) cudaFree(d.q), cudaFree(d.s);
  for (DevQ8& d : w2s) cudaFree(d.q), cudaFree(d.s);
  line("permute alone", median_ms(s, [&] { cuda::moe_permute_one_block(off, src, dest, c.ids, c.n, E, k, s); }));
  line("combine alone", median_ms(s, [&] {
         cuda::moe_combine_rmsnorm(c.normed, c.x, static_cast<const float*>(rest), dest, c.wts, c.norm, c.n, k, kH,
                                   1e-5f, s);
       }));
}

// Each product alone (after the permutation; timing only), the widening products (e4m3 weights
// widened to T against T activations) and the pipeline without the widening; at 32 tokens of the
// channel scheme the switches, and at 8 / 32 / 256 the token tile's height forced (12 / 11 / 9 / 7
// stages of 16 KB of weights).
template <class Tuned, class Line>
void bench_moe_fp8_variants(const MoeCase& c, Fp8Scheme scheme, const Tuned& tuned, const Line& line) {
  cuda::Fp8DecodeTuning tn;
  tn.wgmma = 0;
  line("mma.sync", tuned(tn));
  tn.variant = 8;
  line("mma.sync gate/up", tuned(tn));
  tn.variant = 4;
  line("mma.sync down", tuned(tn));
  tn = {};
  tn.variant = 32;
  line("fixed shares", tuned(tn));
  tn.variant = 64;
  line("one block an SM", tuned(tn));
  tn.variant = 8;
  line("gate/up alone", tuned(tn));
  tn.variant = 4;
  line("down alone", tuned(tn));
  tn = {};
  tn.act_fp8 = 0;
  line("widening", tuned(tn));
  tn.variant = 8;
  line("widening gate/up", tuned(tn));
  tn.variant = 4;
  line("widening down", tuned(tn));
  tn.variant = 0;
  tn.widen = 0;
  line("no widening", tuned(tn));
  if (scheme != Fp8Scheme::Channel || (c.n != 8 && c.n != 32 && c.n != 256)) return;
  for (const int v : {1, 2, 16}) {
    if (c.n != 32) break;
    tn = {};
    tn.variant = v;
    line(v == 1 ? "tiles ungrouped" : v == 2 ? "no L2 hints" : "gate/up late PDL", tuned(tn));
  }
  for (const int64_t xr : {8, 16, 32, 64}) {
    tn = {};
    tn.tile_rows = xr;
    line(xr == 8 ? "tile 8 rows" : xr == 16 ? "tile 16 rows" : xr == 32 ? "tile 32 rows" : "tile 64 rows", tuned(tn));
  }
}

void bench_moe(cudaStream_t s, const std::vector<int64_t>& rows) {
  using T = __nv_bfloat16;
  T* wg = rand_dev<__nv_bfloat16>(kE * kH, 4, 0.05f);
  std::vector<MoeCase> cases;
  for (int64_t n : rows) cases.push_back(moe_case(s, n, wg));
  const std::vector<double> t16 = bench_moe_bf16(s, cases);
  for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128}) {
    // w13 stacked per expert as [w1; w3] with w1's scales then w3's: random data, so one stack of 2I rows
    // quantized as two halves is the same as quantizing (E * 2, I, H)
    DevQ8 q13 = rand_fp8(kE * 2, kI, kH, scheme, 12, 0.02f), q2 = rand_fp8(kE, kH, kI, scheme, 13, 0.02f);
    for (size_t i = 0; i < cases.size(); ++i) {
      const MoeCase& c = cases[i];
      const double scales = c.touched / kE * double(q13.scale_count + q2.scale_count) * 4;
      const double bytes8 = c.touched * 3 * kI * kH + scales + c.act;
      auto tuned = [&](const cuda::Fp8DecodeTuning& tn) {
        return median_ms(s, [&] {
          cuda::moe_experts_decode_fp8_tuned(c.x, c.y, q13.q, q13.s, q2.q, q2.s, scheme, c.ids, c.wts, c.n, kH, kE, kI,
                                             kTopK, c.scratch, tn, s);
        });
      };
      auto line = [&](const char* what, double t) {
        std::printf("moe %4lld tok (%2.0f experts)  fp8 %-8s %-16s %s  %.2fx bf16\n", (long long)c.n, c.touched,
                    fp8_scheme_name(scheme), what, bw(bytes8, t).c_str(), t16[i] / t);
      };
      line("experts_decode", tuned({}));
      bench_moe_fp8_routed(s, c, q13, q2, scheme, line);
      bench_moe_fp8_variants(c, scheme, tuned, line);
    }
    cudaFree(q13.q), cudaFree(q13.s), cudaFree(q2.q), cudaFree(q2.s);
  }
  for (const MoeCase& c : cases)
    for (void* p : std::initializer_list<void*>{c.y, c.normed, c.x, c.logits, c.wts, c.norm, c.ids, c.scratch}) cudaFree(p);
  cudaFree(wg);
}

void bench_projections(cudaStream_t s, int64_t n) {
  using T = __nv_bfloat16;
  struct Shape {
    const char* name;
    int64_t n_in, n_out;
  };
  for (const Shape& sh : {Shape{"qkv", 2048, 3072}, Shape{"out", 2048, 2048}, Shape{"conv in", 2048, 6144},
                          Shape{"dense w13", 2048, 14336}, Shape{"dense w2", 7168, 2048}}) {
    T* in = rand_dev<__nv_bfloat16>(n * sh.n_in, 21, 1.f);
    T* w = rand_dev<__nv_bfloat16>(sh.n_out * sh.n_in, 22, 0.02f);
    float* out = dev_alloc<float>(n * sh.n_out);
    const double act = double(n) * (sh.n_in * 2 + sh.n_out * 8);
    const double t16 = median_ms(s, [&] { cuda::linear_add_f32_decode(out, in, w, n, sh.n_in, sh.n_out, s); });
    cudaFree(w);
    std::printf("proj %-9s %4lld rows  bf16 linear_add_f32_decode %s\n", sh.name, (long long)n,
                bw(double(sh.n_out) * sh.n_in * 2 + act, t16).c_str());
    for (const Fp8Scheme scheme : {Fp8Scheme::Channel, Fp8Scheme::Block128}) {
      DevQ8 q = rand_fp8(1, sh.n_out, sh.n_in, scheme, 23, 0.02f);
      const double bytes8 = double(sh.n_out) * sh.n_in + q.scale_count * 4.0 + act;
      auto call = [&] {
        cuda::linear_fp8_decode(out, cuda::Fp8Out::AddF32, in, q.q, q.s, scheme, n, sh.n_in, sh.n_out, s);
      };
      const double t8 = median_ms(s, call);
      std::printf("proj %-9s %4lld rows  fp8 %-8s linear_fp8     %s  %.2fx bf16\n", sh.name, (long long)n,
                  fp8_scheme_name(scheme), bw(bytes8, t8).c_str(), t16 / t8);
      // the two splits forced (the default picks one by the shape)
      for (const int kh : {2, 8}) {
        if (scheme == Fp8Scheme::Block128) break;
        cuda::Fp8DecodeTuning tn;
        tn.linear_kh = kh;
        const double tk = median_ms(s, [&] {
          cuda::linear_fp8_decode_tuned(out, cuda::Fp8Out::AddF32, in, q.q, q.s, scheme, n, sh.n_in, sh.n_out, tn, s);
        });
        std::printf("proj %-9s %4lld rows  fp8 %-8s linear_fp8 kh %d %s\n", sh.name, (long long)n,
                    fp8_scheme_name(scheme), kh, bw(bytes8, tk).c_str());
      }
      cudaFree(q.q), cudaFree(q.s);
    }
    cudaFree(in), cudaFree(out);
  }
}

}  // namespace
}  // namespace lfm2

std::vector<int64_t> parse_rows(const char* arg) {
  std::vector<int64_t> rows;
  for (const char* p = arg; *p;) {
    char* end = nullptr;
    rows.push_back(std::strtoll(p, &end, 10));
    if (end == p) break;
    p = end;
    if (*p == ',') ++p;
  }
  return rows;
}

int main(int argc, char** argv) {
  using namespace lfm2;
  const std::vector<int64_t> rows = argc > 1 ? parse_rows(argv[1]) : std::vector<int64_t>{8, 32, 64, 128, 256};
  const std::vector<int64_t> proj_rows = argc > 2 ? parse_rows(argv[2]) : rows;
  try {
    cudaStream_t s;
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    bench_copy(s);
    if (!rows.empty() && rows[0] > 0) bench_moe(s, rows);
    for (int64_t n : proj_rows) bench_projections(s, n);
    CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench_fp8: %s\n", e.what());
    return 1;
  }
  return 0;
}
