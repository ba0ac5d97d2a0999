// Kernel timings on the GPU at LFM2-8B-A1B shapes (not a test; run by hand or by the GPU check).
// CUDA events around batches of calls queued back to back, warm-up first, median of the batches'
// mean; every figure beside the measured dense-GEMM peak (cuBLASLt bf16 8192^3 in the same process).
//   cuda_bench_kernels            everything below
//   cuda_bench_kernels moe        the MoE part only
//   cuda_bench_kernels sweep      + every grouped-GEMM tile configuration at every size
//   cuda_bench_kernels moe-decode the prompt rows' MoE kernels (bf16 and FP8) at 32 and 256 tokens
//   cuda_bench_kernels fp8-groups [tokens [sweep]]  the FP8 grouped products by the number of groups,
//                                 beside cuBLASLt (at 4096, 8192, 16384 tokens, or the one given;
//                                 sweep: every block128 configuration and tile schedule, routed)
// Sections: dense peak; the two expert products (balanced groups, as torch's grouped_mm benchmark,
// and routed by random router logits) with the rest of the MoE path; the model's projections with
// pinned vs per-size cuBLASLt algorithms; attention at S = 32, 2048, 8192; the FP8 grouped GEMM's products beside
// the bf16 ones from 4096 tokens.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/grouped_gemm_sm90.h"
#include "kernels/cuda/linear_fp8_lt.h"
#include "kernels/cuda/ops.h"
#include "bench_util.h"

namespace lfm2 {
namespace {

using namespace bench;

double g_peak = 0;  // TFLOP/s, the dense bf16 GEMM measured first

std::string tf(double flops, double ms) {
  char b[96];
  const double t = flops / ms * 1e-9;
  std::snprintf(b, sizeof b, "%7.3f ms %5.0f TFLOP/s (%3.0f%% of peak)", ms, t, g_peak > 0 ? 100 * t / g_peak : 0.);
  return b;
}

void bench_peak(cudaStream_t s) {
  const int64_t n = 8192;
  auto* a = rand_dev<__nv_bfloat16>(n * n, 5, 1.f);
  auto* w = rand_dev<__nv_bfloat16>(n * n, 6, 0.02f);
  auto* o = dev_alloc<__nv_bfloat16>(n * n);
  const double t = median_ms(s, [&] { cuda::linear(o, a, w, n, n, n, s); }, 10);
  g_peak = 2.0 * n * n * n / t * 1e-9;
  std::printf("peak  dense bf16 GEMM 8192^3 (cuBLASLt, pinned): %.3f ms %.0f TFLOP/s\n", t, g_peak);
  cudaFree(a), cudaFree(w), cudaFree(o);
}

// The FP8 products (grouped_gemm_fp8.h) at the bf16 products' sizes: e4m3 experts (random valid
// bits, scales 1e-3) under both schemes, the activations quantized first per 128 columns (block128)
// or per row (channel), the quantizations (fused into the gather and the SwiGLU) timed apart, and
// the prompt rows' whole MoE (moe_experts_fp8, router apart). Speed only: values not checked here.
struct Fp8BenchIn {
  const __nv_bfloat16 *in, *act;  // the tokens (n_tokens, H); an activation (P, Im)
  const int32_t *src, *ids, *bal, *off;
  const float* wts;
  float* x;
  const int32_t* dest;
};

struct Fp8BenchBufs {
  uint8_t *w13, *w2;
  float *s13, *s2;
  uint8_t *q1, *q2;
  float *sa1, *sa2;
  __nv_bfloat16* gu;
  char* ws;
};

// The channel scheme on the plain kernel: every tile configuration's raw products, then the
// consumers that apply the scales (the scaled SwiGLU quantization, the scaled combine) beside the
// unscaled ones.
void bench_channel_plain(cudaStream_t s, int64_t n_tokens, const Fp8BenchIn& b, double f1, double f2,
                         const Fp8BenchBufs& u) {
  const int64_t H = 2048, E = 32, Im = 1792, k = 4, P = n_tokens * k;
  for (int c = 0; c < cuda::grouped::kFp8PlainConfigCount; ++c) {
    cuda::grouped::force_fp8_plain_config(c);
    for (int pass = 0; pass < 2; ++pass) {
      const int32_t* o = pass == 0 ? b.bal : b.off;
      const double t1 =
          median_ms(s, [&] { cuda::moe_grouped_matmul_fp8_raw(u.gu, u.q1, u.w13, o, P, E, H, 2 * Im, u.ws, s); });
      const double t2 =
          median_ms(s, [&] { cuda::moe_grouped_matmul_fp8_raw(u.gu, u.q2, u.w2, o, P, E, Im, H, u.ws, s); });
      std::printf("fp8   moe %5lld tok %-8s plain    gate_up %s | down %s | both %s  [%s]\n", (long long)n_tokens,
                  pass == 0 ? "balanced" : "routed", tf(f1, t1).c_str(), tf(f2, t2).c_str(),
                  tf(f1 + f2, t1 + t2).c_str(), cuda::grouped::fp8_plain_config_name(c));
    }
  }
  cuda::grouped::force_fp8_plain_config(-1);
  const double tsw = median_ms(s, [&] {
    cuda::moe_swiglu_quantize_e4m3_scaled(u.q2, u.sa2, u.gu, u.sa1, u.s13, b.off, P, E, H, Im, s);
  });
  const double tcs = median_ms(s, [&] {
    cuda::moe_combine_fp8_scaled(b.x, u.gu, b.dest, b.wts, u.sa2, u.s2, b.off, n_tokens, E, k, H, Im, s);
  });
  const double tc =
      median_ms(s, [&] { cuda::moe_combine<__nv_bfloat16>(b.x, u.gu, b.dest, b.wts, n_tokens, k, H, s); });
  std::printf("fp8   moe %5lld tok routed   plain    swiglu+scales+quantize %.3f ms | combine with scales %.3f ms "
              "(moe_combine %.3f)\n", (long long)n_tokens, tsw, tcs, tc);
}

void bench_moe_fp8(cudaStream_t s, int64_t n_tokens, const Fp8BenchIn& b, double f1, double f2) {
  const int64_t H = 2048, E = 32, Im = 1792, k = 4, P = n_tokens * k;
  auto* w13 = dev_alloc<uint8_t>(E * 2 * Im * H);
  auto* w2 = dev_alloc<uint8_t>(E * H * Im);
  CUDA_CHECK(cudaMemset(w13, 0x3a, size_t(E * 2 * Im * H)));  // e4m3 0x3a = 1.25: valid, not zero
  CUDA_CHECK(cudaMemset(w2, 0xb4, size_t(E * H * Im)));      // -0.75
  std::vector<float> ones(size_t(E * (H / 128) * 2 * Im), 1e-3f);  // the larger of both schemes' counts
  auto* s13 = dev_alloc<float>(int64_t(ones.size()));
  auto* s2 = dev_alloc<float>(int64_t(ones.size()));
  CUDA_CHECK(cudaMemcpy(s13, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(s2, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  auto* q1 = dev_alloc<uint8_t>(P * H);
  auto* q2 = dev_alloc<uint8_t>(P * Im);
  auto* sa1 = dev_alloc<float>(P * H / 128);
  auto* sa2 = dev_alloc<float>(P * Im / 128);
  auto* gu = dev_alloc<__nv_bfloat16>(P * 2 * Im);
  auto* ws = dev_alloc<char>(cuda::moe_grouped_matmul_fp8_workspace_bytes(E));
  auto* scratch = dev_alloc<char>(cuda::moe_experts_fp8_scratch_bytes(n_tokens, H, E, Im, k));
  CUDA_CHECK(cudaMemcpy(gu, b.act, size_t(P * Im) * 2, cudaMemcpyDeviceToDevice));  // a real SwiGLU input
  CUDA_CHECK(cudaMemcpy(gu + P * Im, b.act, size_t(P * Im) * 2, cudaMemcpyDeviceToDevice));
  for (const Fp8Scheme scheme : {Fp8Scheme::Block128, Fp8Scheme::Channel}) {
    const bool per_row = scheme == Fp8Scheme::Channel;
    const double tg = median_ms(s, [&] { cuda::moe_quantize_e4m3(q1, sa1, b.in, b.src, b.off, P, E, H, per_row, s); });
    const double tsw =
        median_ms(s, [&] { cuda::moe_swiglu_quantize_e4m3(q2, sa2, gu, nullptr, b.off, P, E, Im, per_row, s); });
    for (int pass = 0; pass < 2; ++pass) {
      const int32_t* o = pass == 0 ? b.bal : b.off;
      const double t1 = median_ms(s, [&] {
        cuda::moe_grouped_matmul_fp8(gu, q1, sa1, w13, s13, scheme, o, P, E, H, 2 * Im, ws, s);
      });
      const double t2 = median_ms(s, [&] {
        cuda::moe_grouped_matmul_fp8(gu, q2, sa2, w2, s2, scheme, o, P, E, Im, H, ws, s);
      });
      std::printf("fp8   moe %5lld tok %-8s %-8s gate_up %s | down %s | both %s | gather+quantize %.3f, "
                  "swiglu+quantize %.3f ms\n",
                  (long long)n_tokens, pass == 0 ? "balanced" : "routed", fp8_scheme_name(scheme), tf(f1, t1).c_str(),
                  tf(f2, t2).c_str(), tf(f1 + f2, t1 + t2).c_str(), tg, tsw);
    }
    auto whole = [&] {
      return median_ms(s, [&] {
        cuda::moe_experts_fp8(b.x, b.in, w13, s13, w2, s2, scheme, b.ids, b.wts, n_tokens, H, E, Im, k, scratch, s);
      });
    };
    if (per_row) {
      cuda::grouped::set_fp8_channel_plain(false);
      std::printf("fp8   moe %5lld tok routed   %-8s whole moe_experts_fp8 (no router), blockwise kernel %.3f ms\n",
                  (long long)n_tokens, fp8_scheme_name(scheme), whole());
      cuda::grouped::set_fp8_channel_plain(true);
      bench_channel_plain(s, n_tokens, b, f1, f2, {w13, w2, s13, s2, q1, q2, sa1, sa2, gu, ws});
    }
    if (!per_row) {
      cuda::grouped::set_fp8_block_padded(false);
      std::printf("fp8   moe %5lld tok routed   %-8s whole moe_experts_fp8 (no router), grouped kernel %.3f ms\n",
                  (long long)n_tokens, fp8_scheme_name(scheme), whole());
      cuda::grouped::set_fp8_block_padded(true);
      cuda::grouped::set_fp8_swiglu_fused(false);
      std::printf("fp8   moe %5lld tok routed   %-8s whole moe_experts_fp8 (no router), padded, SwiGLU launched "
                  "apart %.3f ms\n",
                  (long long)n_tokens, fp8_scheme_name(scheme), whole());
      cuda::grouped::set_fp8_swiglu_fused(true);
    }
    std::printf("fp8   moe %5lld tok routed   %-8s whole moe_experts_fp8 (no router) %.3f ms\n", (long long)n_tokens,
                fp8_scheme_name(scheme), whole());
  }
  for (void* p : std::initializer_list<void*>{w13, w2, s13, s2, q1, q2, sa1, sa2, gu, ws, scratch}) cudaFree(p);
}

// Where the FP8 experts' products lose against cuBLASLt's FP8 matmul (issue 23's prefill): gate/up
// and down (block128) at n_tokens x top-4 rows on random e4m3 codes (|v| < 2, no NaN) and random
// scales, the CUTLASS grouped kernel over the rows split evenly among 1, 2, 4, 8, 16 and 32 experts
// (the rest empty) and routed by random logits, beside cuBLASLt's block128 FP8 matmul
// (linear_fp8_quantized, the projections' path) of every row with expert 0's weights.
// n random e4m3 codes on the device: exponent field below 8 (no NaN, |v| < 2).
uint8_t* random_codes(int64_t n, uint64_t seed) {
  std::vector<uint8_t> h(static_cast<size_t>(n));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : h) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = uint8_t((x >> 24) & 0xbf);
  }
  return upload(h);
}

// n random scales in [0.005, 0.015) on the device.
float* random_scales(int64_t n, uint64_t seed) {
  auto h = rand_host(n, seed, 0.5f);
  for (auto& v : h) v = (1.f + v) * 1e-2f;
  return upload(h);
}

// The routing offsets of random router logits (top-k of n_experts) into off (n_experts + 1, device).
void route_random(int32_t* off, int64_t n_tokens, int64_t n_experts, int64_t k, cudaStream_t s) {
  float* logits = rand_dev<float>(n_tokens * n_experts, 4, 3.f);
  auto* wts = dev_alloc<float>(n_tokens * k);
  auto *ids = dev_alloc<int32_t>(n_tokens * k), *src = dev_alloc<int32_t>(n_tokens * k),
       *dest = dev_alloc<int32_t>(n_tokens * k);
  auto* pscr = dev_alloc<int32_t>(cuda::moe_permute_scratch_ints(n_tokens, n_experts, k));
  cuda::moe_router(wts, ids, logits, nullptr, n_tokens, n_experts, k, true, 1.f, s);
  cuda::moe_permute(off, src, dest, ids, n_tokens, n_experts, k, pscr, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (void* p : std::initializer_list<void*>{logits, wts, ids, src, dest, pscr}) cudaFree(p);
}

// `grouped(name)` under every block128 configuration and tile schedule of the blockwise kernel
// (the same bits), the default's afterwards.
void sweep_fp8_block_configs(int64_t n_tokens, const std::function<void(const char*)>& grouped) {
  for (int c = 0; c < cuda::grouped::kFp8BlockConfigCount; ++c)
    for (const bool along_n : {false, true})
      for (const int swizzle : {1, 2, 4, 8}) {
        cuda::grouped::force_fp8_block_config(c);
        cuda::grouped::set_fp8_block_schedule(along_n, swizzle);
        const std::string what =
            std::string(cuda::grouped::fp8_block_config_name(c)) + (along_n ? " N" : " M") + std::to_string(swizzle);
        try {
          grouped(what.c_str());
        } catch (const Error& e) {
          std::printf("fp8g  %5lld tok %s: %s\n", (long long)n_tokens, what.c_str(), e.what());
        }
      }
  cuda::grouped::force_fp8_block_config(-1);
  cuda::grouped::set_fp8_block_schedule(false, 1);
}

struct Fp8Weights {
  const uint8_t *w13, *w2;
  const float *s13, *s2;
};

// The routed rows of `off` padded per expert, on the padded product (one GEMM): both products,
// with the tiles past the rows in use skipped and every tile, TFLOP/s of the routed rows alone (the
// padding's work is the cost).
void bench_fp8_padded(cudaStream_t s, int64_t n_tokens, const int32_t* off, const Fp8Weights& w) {
  const int64_t H = 2048, E = 32, Im = 1792, k = 4, P = n_tokens * k, m_pad = cuda::moe_padded_rows(P, E);
  std::vector<int32_t> h(size_t(E + 1));
  CUDA_CHECK(cudaMemcpy(h.data(), off, h.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> tiles(size_t(m_pad / 128), int32_t(E - 1));
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = (h[size_t(e + 1)] - h[size_t(e)] + 127) / 128;
    std::fill_n(tiles.begin() + at, n, int32_t(e));
    at += n;
  }
  int32_t* d_tiles = upload(tiles);
  int32_t* d_used = upload(std::vector<int32_t>{int32_t(at * 128)});  // the tiles past them skipped
  uint8_t *q1 = random_codes(m_pad * H, 13), *q2 = random_codes(m_pad * Im, 14);
  float *sa1 = random_scales(m_pad * H / 128, 15), *sa2 = random_scales(m_pad * Im / 128, 16);
  auto* gu = dev_alloc<__nv_bfloat16>(m_pad * 2 * Im);
  auto* ws = dev_alloc<char>(cuda::moe_grouped_matmul_fp8_workspace_bytes(E));
  const double f1 = 2.0 * P * 2 * Im * H, f2 = 2.0 * P * H * Im;
  for (const bool skip : {true, false}) {  // the tiles past the rows in use skipped (the default), then all
    const int32_t* used = skip ? d_used : nullptr;
    const double t1 = median_ms(s, [&] {
      cuda::moe_grouped_matmul_fp8_padded(gu, q1, sa1, w.w13, w.s13, d_tiles, used, m_pad, E, H, 2 * Im, ws, s);
    });
    const double t2 = median_ms(s, [&] {
      cuda::moe_grouped_matmul_fp8_padded(gu, q2, sa2, w.w2, w.s2, d_tiles, used, m_pad, E, Im, H, ws, s);
    });
    const std::string what = skip ? "routed, padded (" + std::to_string(at) + " of " + std::to_string(m_pad / 128) + ")"
                                  : "routed, padded, all";
    std::printf("fp8g  %5lld tok %-22s gate_up %s | down %s | both %s\n", (long long)n_tokens, what.c_str(),
                tf(f1, t1).c_str(), tf(f2, t2).c_str(), tf(f1 + f2, t1 + t2).c_str());
  }
  for (void* p : std::initializer_list<void*>{d_tiles, d_used, q1, q2, sa1, sa2, gu, ws}) cudaFree(p);
}

void bench_fp8_groups(cudaStream_t s, int64_t n_tokens, bool schedules) {
  const int64_t H = 2048, E = 32, Im = 1792, k = 4, P = n_tokens * k;
  uint8_t *w13 = random_codes(E * 2 * Im * H, 1), *w2 = random_codes(E * H * Im, 2), *q1 = random_codes(P * H, 3),
          *q2 = random_codes(P * Im, 4);
  const int64_t n_w_scales = E * (H / 128) * (2 * Im / 128) + 64;  // cuBLASLt's padded rows fit too
  float *s13 = random_scales(n_w_scales, 5), *s2 = random_scales(n_w_scales, 6),
        *sa1 = random_scales(P * H / 128, 7), *sa2 = random_scales(P * Im / 128, 8);
  auto* gu = dev_alloc<__nv_bfloat16>(P * 2 * Im);
  auto* ws = dev_alloc<char>(cuda::moe_grouped_matmul_fp8_workspace_bytes(E));
  auto* lt_scratch = dev_alloc<char>(cuda::linear_fp8_scratch_bytes(P, H, 2 * Im));
  auto* off = dev_alloc<int32_t>(E + 1);
  const double f1 = 2.0 * P * 2 * Im * H, f2 = 2.0 * P * H * Im;
  auto grouped = [&](const char* what) {
    const double t1 = median_ms(s, [&] {
      cuda::moe_grouped_matmul_fp8(gu, q1, sa1, w13, s13, Fp8Scheme::Block128, off, P, E, H, 2 * Im, ws, s);
    });
    const double t2 = median_ms(s, [&] {
      cuda::moe_grouped_matmul_fp8(gu, q2, sa2, w2, s2, Fp8Scheme::Block128, off, P, E, Im, H, ws, s);
    });
    std::printf("fp8g  %5lld tok %-22s gate_up %s | down %s | both %s\n", (long long)n_tokens, what,
                tf(f1, t1).c_str(), tf(f2, t2).c_str(), tf(f1 + f2, t1 + t2).c_str());
  };
  auto even = [&](int64_t groups) {
    std::vector<int32_t> h(size_t(E + 1));
    for (int64_t e = 0; e <= E; ++e) h[size_t(e)] = int32_t(P * std::min(e, groups) / groups);
    CUDA_CHECK(cudaMemcpy(off, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  };
  for (int64_t groups : {1, 2, 4, 8, 16, 32}) {
    even(groups);
    grouped(("balanced over " + std::to_string(groups)).c_str());
  }
  route_random(off, n_tokens, E, k, s);
  grouped("routed over 32");
  bench_fp8_padded(s, n_tokens, off, {w13, w2, s13, s2});
  if (schedules) sweep_fp8_block_configs(n_tokens, grouped);
  const double l1 = median_ms(s, [&] {
    cuda::linear_fp8_quantized<__nv_bfloat16>(gu, cuda::LtOut::kT, q1, sa1, P, w13, s13, Fp8Scheme::Block128, P, H,
                                              2 * Im, lt_scratch, s);
  });
  const double l2 = median_ms(s, [&] {
    cuda::linear_fp8_quantized<__nv_bfloat16>(gu, cuda::LtOut::kT, q2, sa2, P, w2, s2, Fp8Scheme::Block128, P, Im, H,
                                              lt_scratch, s);
  });
  std::printf("fp8g  %5lld tok %-22s gate_up %s | down %s | both %s\n", (long long)n_tokens, "cuBLASLt, one weight",
              tf(f1, l1).c_str(), tf(f2, l2).c_str(), tf(f1 + f2, l1 + l2).c_str());
  for (void* p : std::initializer_list<void*>{w13, w2, q1, q2, s13, s2, sa1, sa2, gu, ws, lt_scratch, off}) cudaFree(p);
}

// Every tile configuration of the grouped GEMM: `products(offsets)` (gate/up ms, down ms) on the
// balanced and the routed groups.
template <typename F>
void sweep_tiles(const char* name, int64_t n_tokens, F&& products, const int32_t* bal, const int32_t* off,
                 double flops) {
  for (int c = 0; c < cuda::grouped::kGroupedConfigCount; ++c) {
    cuda::grouped::force_config(c);
    const auto [t1, t2] = products(bal);
    const auto [r1, r2] = products(off);
    std::printf("sweep %-5s %5lld tok  %-26s balanced both %s | routed both %s\n", name, (long long)n_tokens,
                cuda::grouped::kGroupedTiles[c].name, tf(flops, t1 + t2).c_str(), tf(flops, r1 + r2).c_str());
  }
  cuda::grouped::force_config(-1);
}

// The MoE experts at n_tokens tokens: products on balanced groups (rows / 32 per expert, like
// roofline.py's torch._grouped_mm) and on the routing of random logits, then the whole path.
template <typename T>
void bench_moe(const char* name, cudaStream_t s, int64_t n_tokens, bool sweep, bool small = false) {
  const int64_t H = 2048, E = 32, Im = 1792, k = 4, P = n_tokens * k;
  T* in = rand_dev<T>(n_tokens * H, 1, 1.f);
  T* w13 = rand_dev<T>(E * 2 * Im * H, 2, 0.02f);
  T* w2 = rand_dev<T>(E * H * Im, 3, 0.02f);
  float* logits = rand_dev<float>(n_tokens * E, 4, 3.f);
  auto* x = dev_alloc<float>(n_tokens * H);
  auto* wts = dev_alloc<float>(P);
  auto *ids = dev_alloc<int32_t>(P), *off = dev_alloc<int32_t>(E + 1), *bal = dev_alloc<int32_t>(E + 1);
  auto *src = dev_alloc<int32_t>(P), *dest = dev_alloc<int32_t>(P);
  auto* pscr = dev_alloc<int32_t>(cuda::moe_permute_scratch_ints(n_tokens, E, k));
  T *xs = dev_alloc<T>(P * H), *gu = dev_alloc<T>(P * 2 * Im), *act = dev_alloc<T>(P * Im), *y = dev_alloc<T>(P * H);
  auto* ws = dev_alloc<char>(cuda::moe_grouped_matmul_workspace_bytes(E));
  auto* scratch = dev_alloc<char>(cuda::moe_experts_scratch_bytes(n_tokens, H, E, Im, k, sizeof(T)));
  CUDA_CHECK(cudaMemset(x, 0, size_t(n_tokens * H) * 4));
  {  // the down product's input: a real activation's scale, not zeros (zeros run faster)
    T* a0 = rand_dev<T>(P * Im, 16, 1.f);
    CUDA_CHECK(cudaMemcpy(act, a0, size_t(P * Im) * sizeof(T), cudaMemcpyDeviceToDevice));
    cudaFree(a0);
  }
  std::vector<int32_t> hb(static_cast<size_t>(E + 1));
  for (int64_t e = 0; e <= E; ++e) hb[e] = int32_t(P * e / E);
  CUDA_CHECK(cudaMemcpy(bal, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  cuda::moe_router(wts, ids, logits, nullptr, n_tokens, E, k, true, 1.f, s);
  cuda::moe_permute(off, src, dest, ids, n_tokens, E, k, pscr, s);
  cuda::moe_gather(xs, in, src, P, H, s);  // the products read real rows, not uninitialised memory
  CUDA_CHECK(cudaStreamSynchronize(s));
  const double f1 = 2.0 * P * 2 * Im * H, f2 = 2.0 * P * H * Im;

  auto products = [&](const int32_t* offsets) {
    const double t1 = median_ms(s, [&] { cuda::moe_grouped_matmul(gu, xs, w13, offsets, P, E, H, 2 * Im, ws, s); });
    const double t2 = median_ms(s, [&] { cuda::moe_grouped_matmul(y, act, w2, offsets, P, E, Im, H, ws, s); });
    return std::make_pair(t1, t2);
  };
  const char* cfg_name = std::is_same<T, float>::value
                             ? "SIMT fp32"
                             : cuda::grouped::kGroupedTiles[cuda::grouped::pick_config(P, E)].name;
  for (int pass = 0; pass < 2; ++pass) {
    const auto [t1, t2] = products(pass == 0 ? bal : off);
    std::printf("%-5s moe %5lld tok %-8s gate_up %s | down %s | both %s  [%s]\n", name, (long long)n_tokens,
                pass == 0 ? "balanced" : "routed", tf(f1, t1).c_str(), tf(f2, t2).c_str(), tf(f1 + f2, t1 + t2).c_str(),
                cfg_name);
  }
  if (sweep && !std::is_same<T, float>::value) sweep_tiles(name, n_tokens, products, bal, off, f1 + f2);
  if constexpr (!std::is_same<T, float>::value) {  // the gate/up product with SwiGLU fused in its epilogue
    for (int pass = 0; pass < 2; ++pass) {
      const int32_t* o = pass == 0 ? bal : off;
      const double tf1 = median_ms(s, [&] { cuda::moe_grouped_swiglu(act, xs, w13, o, P, E, H, Im, ws, s); });
      const double tu1 = median_ms(s, [&] {
        cuda::moe_grouped_matmul(gu, xs, w13, o, P, E, H, 2 * Im, ws, s);
        cuda::swiglu_pairs(act, gu, P, Im, s);
      });
      std::printf("%-5s moe %5lld tok %-8s gate_up+SwiGLU fused %s | product + swiglu_pairs %s\n", name,
                  (long long)n_tokens, pass == 0 ? "balanced" : "routed", tf(f1, tf1).c_str(), tf(f1, tu1).c_str());
    }
  }
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    if (n_tokens >= 4096 || small) bench_moe_fp8(s, n_tokens, {in, act, src, ids, bal, off, wts, x, dest}, f1, f2);
  const double t_route = median_ms(s, [&] { cuda::moe_router(wts, ids, logits, nullptr, n_tokens, E, k, true, 1.f, s); });
  const double t_perm = median_ms(s, [&] { cuda::moe_permute(off, src, dest, ids, n_tokens, E, k, pscr, s); });
  const double t_gather = median_ms(s, [&] { cuda::moe_gather(xs, in, src, P, H, s); });
  const double t_swiglu = median_ms(s, [&] { cuda::swiglu(act, gu, P, Im, s); });
  const double t_comb = median_ms(s, [&] { cuda::moe_combine(x, y, dest, wts, n_tokens, k, H, s); });
  auto whole = [&] {
    cuda::moe_router(wts, ids, logits, nullptr, n_tokens, E, k, true, 1.f, s);
    cuda::moe_experts(x, in, w13, w2, ids, wts, n_tokens, H, E, Im, k, scratch, s);
  };
  const double tall = median_ms(s, whole);
  const double texp = median_ms(s, [&] { cuda::moe_experts(x, in, w13, w2, ids, wts, n_tokens, H, E, Im, k, scratch, s); });
  std::printf("%-5s moe %5lld tok route %.3f permute %.3f gather %.3f swiglu %.3f combine %.3f ms | route+experts %s"
              " | experts alone %.3f ms\n",
              name, (long long)n_tokens, t_route, t_perm, t_gather, t_swiglu, t_comb, tf(f1 + f2, tall).c_str(), texp);
  for (void* p : std::initializer_list<void*>{in, w13, w2, logits, x, wts, ids, off, bal, src, dest, pscr, xs, gu, act,
                                              y, ws, scratch})
    cudaFree(p);
}

// The model's projections: pinned algorithm (the default) vs cuBLASLt's choice per row count.
void bench_projections(cudaStream_t s) {
  struct Proj {
    const char* name;
    int64_t n_in, n_out;
  };
  const Proj projs[] = {{"conv in_proj", 2048, 6144}, {"qkv", 2048, 3072}, {"out_proj", 2048, 2048},
                        {"dense w13", 2048, 14336}, {"dense w2", 7168, 2048}};
  const int64_t max_t = 32768;
  auto* a = rand_dev<__nv_bfloat16>(max_t * 7168, 7, 1.f);
  auto* w = rand_dev<__nv_bfloat16>(14336 * 2048, 8, 0.02f);
  auto* o = dev_alloc<__nv_bfloat16>(max_t * 14336);
  auto* x = dev_alloc<float>(max_t * 2048);
  CUDA_CHECK(cudaMemset(x, 0, size_t(max_t * 2048) * 4));
  for (const Proj& p : projs)
    for (int64_t t : {int64_t(1024), int64_t(4096), int64_t(16384), max_t}) {
      const double fl = 2.0 * t * p.n_in * p.n_out;
      const bool add = p.n_out == 2048;  // the output projections add into the fp32 residual
      auto run = [&] {
        if (add)
          cuda::linear_add_f32(x, a, w, t, p.n_in, p.n_out, s);
        else
          cuda::linear(o, a, w, t, p.n_in, p.n_out, s);
      };
      cuda::set_gemm_pinning(true);
      const double tp = median_ms(s, run);
      cuda::set_gemm_pinning(false);
      const double tu = median_ms(s, run);
      cuda::set_gemm_pinning(true);
      std::printf("bf16  %-12s %5lld tok %-7s pinned %s | per-size %s\n", p.name, (long long)t, add ? "(+= x)" : "",
                  tf(fl, tp).c_str(), tf(fl, tu).c_str());
    }
  cudaFree(a), cudaFree(w), cudaFree(o), cudaFree(x);
}

// The memory-bound kernels of a layer at n tokens (bf16): GB/s against the bytes each must move.
void bench_layer_kernels(cudaStream_t s, int64_t n) {
  using T = __nv_bfloat16;
  const int64_t H = 2048, nh = 32, nkv = 8, hd = 64, width = (nh + 2 * nkv) * hd;
  float* x = rand_dev<float>(n * H, 11, 3.f);
  float* w = rand_dev<float>(H * 3, 12, 1.f);
  T* y = dev_alloc<T>(n * H);
  T* bcx = rand_dev<T>(n * 3 * H, 13, 1.f);
  T* qkv = rand_dev<T>(n * width, 14, 1.f);
  float* inv_freq = rand_dev<float>(hd / 2, 15, 0.01f);
  auto gbs = [](double bytes, double ms) { return bytes / ms * 1e-6; };
  const double t_norm = median_ms(s, [&] { cuda::rmsnorm(y, x, w, n, H, 1e-5f, s); });
  const double t_conv = median_ms(s, [&] { cuda::short_conv(y, bcx, w, n / 32, 32, H, 3, s); });
  const double t_rope = median_ms(s, [&] {
    cuda::qk_norm_rope(qkv, w, w, inv_freq, n / 32, 32, nh, nkv, hd, 1e-5f, s);
  });
  std::printf("bf16  layer kernels %5lld tok: rmsnorm %.3f ms (%.0f GB/s) | short_conv %.3f ms (%.0f GB/s) | "
              "qk_norm_rope %.3f ms (%.0f GB/s)\n",
              (long long)n, t_norm, gbs(n * H * (4.0 + 2.0), t_norm), t_conv, gbs(n * H * (6.0 + 2.0), t_conv), t_rope,
              gbs(n * (nh + nkv) * hd * 4.0, t_rope));
  cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(bcx), cudaFree(qkv), cudaFree(inv_freq);
}

template <typename T>
void bench_attention(const char* name, cudaStream_t s, int64_t n_seq, int64_t S) {
  const int64_t nh = 32, nkv = 8, hd = 64, width = (nh + 2 * nkv) * hd, n = n_seq * S;
  T* qkv = rand_dev<T>(n * width, 7, 1.f);
  T* o = dev_alloc<T>(n * nh * hd);
  const double t = median_ms(s, [&] {
    cuda::attention(o, qkv, qkv + nh * hd, qkv + (nh + nkv) * hd, n_seq, S, nh, nkv, hd, 0.125f, s, width, width);
  });
  const double flops = 4.0 * n_seq * nh * hd * (S * (S + 1) / 2.0);  // qk and pv, causal
  const double bytes = double(n) * (width + nh * hd) * sizeof(T);     // read q, k, v once, write o
  std::printf("%-5s attention %5lld x %-5lld (32/8 heads, hd 64): %s, %.0f GB/s of the q/k/v/o bytes\n", name,
              (long long)n_seq, (long long)S, tf(flops, t).c_str(), bytes / t * 1e-6);
  cudaFree(qkv), cudaFree(o);
}

}  // namespace
}  // namespace lfm2

namespace lfm2 {
namespace {

// The command line, checked before any GPU work (also where there is no GPU).
struct Args {
  std::string mode;          // "", moe, sweep, moe-decode or fp8-groups
  int64_t fp8_tokens = 0;    // fp8-groups' tokens (0: 4,096, 8,192 and 16,384)
  bool fp8_sweep = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  a.mode = argc > 1 ? argv[1] : "";
  const bool known = a.mode.empty() || a.mode == "moe" || a.mode == "sweep" || a.mode == "moe-decode" ||
                     a.mode == "fp8-groups";
  LFM2_CHECK(known, "cuda_bench_kernels: mode '", a.mode, "' (moe, sweep, moe-decode or fp8-groups)");
  const int most = a.mode == "fp8-groups" ? 4 : 2;
  LFM2_CHECK(argc <= most, "cuda_bench_kernels: ", argc - most, " arguments too many for mode '", a.mode, "'");
  if (argc > 2) {
    char* end = nullptr;
    const long long t = std::strtoll(argv[2], &end, 10);
    LFM2_CHECK(*argv[2] && !*end && t >= 1 && t <= 65536, "cuda_bench_kernels fp8-groups: tokens '", argv[2],
               "' (a whole number in [1, 65536])");
    a.fp8_tokens = t;
  }
  if (argc > 3) {
    LFM2_CHECK(std::string(argv[3]) == "sweep", "cuda_bench_kernels fp8-groups: '", argv[3], "' (only: sweep)");
    a.fp8_sweep = true;
  }
  return a;
}

}  // namespace
}  // namespace lfm2

int main(int argc, char** argv) {
  using namespace lfm2;
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const std::string& mode = args.mode;
  const bool moe_only = mode == "moe", sweep = mode == "sweep", decode_sizes = mode == "moe-decode";
  const bool fp8_groups = mode == "fp8-groups";
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
  bench_peak(s);
  if (fp8_groups) {  // the FP8 grouped products against cuBLASLt, by the number of groups
    if (args.fp8_tokens) return bench_fp8_groups(s, args.fp8_tokens, args.fp8_sweep), 0;
    for (int64_t t : {4096, 8192, 16384}) bench_fp8_groups(s, t, false);
    return 0;
  }
  if (decode_sizes) {  // the prompt rows' MoE (CUTLASS grouped GEMMs, bf16 and FP8) at decode sizes
    for (int64_t t : {32, 256}) bench_moe<__nv_bfloat16>("bf16", s, t, false, true);
    return 0;
  }
  for (int64_t t : {1024, 4096, 8192, 16384}) bench_moe<__nv_bfloat16>("bf16", s, t, sweep);
  bench_moe<__half>("fp16", s, 4096, false);
  bench_moe<float>("fp32", s, 4096, false);
  if (moe_only) return 0;
  bench_projections(s);
  for (int64_t t : {4096, 16384}) bench_layer_kernels(s, t);
  for (auto [ns, S] : {std::pair<int64_t, int64_t>{128, 32}, {1024, 32}, {2, 2048}, {16, 2048}, {1, 8192}, {4, 8192}})
    bench_attention<__nv_bfloat16>("bf16", s, ns, S);
  bench_attention<__half>("fp16", s, 4, 8192);
  bench_attention<float>("fp32", s, 128, 32);
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
