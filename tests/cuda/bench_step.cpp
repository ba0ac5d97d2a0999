// The decode step of generation through the batch API (not a test): a model file on one GPU as one
// stage, B sequences whose caches hold C positions (pages of 64, one run each; the cache's values do
// not change the time), the step as the engine runs it (embed_batch of the fed tokens,
// forward_batch replayed from its CUDA Graph, choose_batch greedy on the device), timed with
// events over back-to-back steps, the host never waiting between them. Beside each time the memory
// floor: every weight the step must read once (the dense and attention / conv products, the router,
// the experts the B x top-k picks touch under uniform routing, the LM head, B embedding rows) plus
// the KV cache read, at the device-to-device copy bandwidth measured in the same process. With
// `layers`, also one layer of each kind as a stage of its own (their sum, times the model's count
// of each kind, plus the embedding and head, estimates a model with more layers). Then a trace of
// one step of the first case (CUPTI's kernel records): its kernels, the time the GPU ran none of
// them between the first's start and the last's end, the longest such gaps, and the step as
// Chrome trace-event JSON into $OUT/step_trace.json (or ./step_trace.json). Three steps are
// traced back to back and the second reported: the first waits on the host, as no step of a run does.
// `prefill`: one prompt of `rows` rows (default 8192) through the whole model as a static run's
// prefill item, timed, then traced (the time per kernel name).
//   cuda_bench_step MODEL.h5 [BxC,BxC,...] [steps] [layers]
//   cuda_bench_step MODEL.h5 prefill [rows] [reps]
//   cuda_bench_step MODEL.h5 score [SEQSxLEN] [reps]   (a scoring microbatch, default 256x32)
//   defaults: 32x1024,32x4096,32x8192,32x16384,256x64 20; LFM2_BENCH_KV=fp8: the fp8 KV cache. An
//   FP8 file runs as the stage runs it (e4m3 experts), its floor counted in e4m3 bytes;
//   LFM2_BENCH_SWIGLU=apart (score): its experts' SwiGLU launched apart, not in gate/up's epilogue.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/rng.h"
#include "io/weight_file.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "model/cuda_stage.h"
#include "cupti_trace.h"

using namespace lfm2;
using namespace lfm2::bench;

namespace {

double g_copy_gbs = 0;  // GB/s, read + write bytes / time

void bench_copy() {
  const size_t n = size_t(1) << 31;
  char *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaMalloc(&a, n));
  CUDA_CHECK(cudaMalloc(&b, n));
  CUDA_CHECK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  std::vector<float> t;
  for (int i = 0; i < 5; ++i) {
    CUDA_CHECK(cudaEventRecord(e0));
    CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  g_copy_gbs = 2.0 * double(n) / t[2] * 1e-6;
  std::printf("copy 2 GiB device to device: %.3f ms, %.0f GB/s (the floor's bandwidth; the DRAM's peak %.0f)\n", t[2],
              g_copy_gbs, cuda::device_info(cuda::current_device()).peak_dram_gbs);
  cudaFree(a), cudaFree(b);
}

// Bytes a decode step of B rows must read in layers [l0, l1) (and the embedding rows / head where
// the stage has them), compute dtype of 2 bytes; the KV cache of C positions per sequence.
struct Floor {
  double weights = 0, kv = 0;
};

// Bytes an element: an FP8 file's experts (and with lfm2_modules "projections" its projections) are
// e4m3 on the device (their scales are left out: < 1 %); the rest bf16. The KV cache: 2 hd bytes a
// head, or hd + 4 with the fp8 cache.
Floor floor_bytes(const ModelConfig& c, int l0, int l1, bool first, bool last, int64_t B, int64_t C, bool kv_fp8) {
  const double H = double(c.hidden_size), hd = double(c.head_dim()), nh = double(c.num_attention_heads);
  const double nkv = double(c.num_key_value_heads), E = double(c.num_experts), k = double(c.num_experts_per_tok);
  const double touched = E * (1 - std::pow(1 - k / E, double(B)));  // expected distinct experts
  const double ex = c.fp8.on ? 1 : 2, pr = c.fp8.on && c.fp8.projections ? 1 : 2;
  Floor f;
  for (int il = l0; il < l1; ++il) {
    f.weights += pr * (c.is_attention(il) ? H * (nh + 2 * nkv) * hd + nh * hd * H : 4 * H * H);
    f.weights += c.is_moe(il) ? 2 * E * H + ex * touched * 3 * H * double(c.moe_intermediate_size)
                              : pr * 3 * H * double(c.intermediate_size);
    if (c.is_attention(il)) f.kv += double(B) * double(C + 1) * 2 * nkv * (kv_fp8 ? hd + 4 : 2 * hd);
  }
  if (first) f.weights += 2 * double(B) * H;
  if (last) f.weights += 2 * double(c.vocab_size) * H;
  return f;
}

// ms of each of n calls f(0) .. f(n - 1) queued back to back, an event before each and after the
// last (the host never waiting on the GPU between them).
template <class F>
std::vector<double> event_times(CudaStageExecutor& st, int n, F&& f) {
  std::vector<cudaEvent_t> ev(size_t(n + 1));
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < n; ++i) {
    st.record_event(ev[size_t(i)]);
    f(i);
  }
  st.record_event(ev[size_t(n)]);
  CUDA_CHECK(cudaEventSynchronize(ev.back()));
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i + 1)]));
    t.push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return t;
}

struct Timing {
  double median = 0, mean = 0, p99 = 0;
};

// `steps` decode steps of B sequences at positions C, C + 1, ... after 3 untimed ones (the graph's
// capture among them).
Timing time_steps(CudaStageExecutor& st, const StageLayers& r, int64_t hidden, int64_t B, int64_t C, int steps,
                  const char* trace_json = nullptr) {
  const int64_t page = 64, max_pages = (C + steps + 8 + page - 1) / page;
  st.alloc_batch_state({B, B * max_pages, page, max_pages}, SamplingParams{});
  std::vector<int32_t> pages(static_cast<size_t>(max_pages));
  for (int64_t s = 0; s < B; ++s) {
    for (int64_t i = 0; i < max_pages; ++i) pages[size_t(i)] = int32_t(s * max_pages + i);
    st.map_pages(s, 0, pages.data(), max_pages);
  }
  void* x = st.alloc_hidden(B + 1);  // rows, then the finished flags
  int32_t* tokens = st.alloc_tokens(B);
  std::vector<int32_t> ids(static_cast<size_t>(B));
  for (int64_t s = 0; s < B; ++s) ids[size_t(s)] = int32_t(1000 + 7 * s);
  CUDA_CHECK(cudaMemcpy(tokens, ids.data(), size_t(B) * 4, cudaMemcpyHostToDevice));
  if (!r.is_first()) {  // a middle stage: random rows (they route to the experts as a model's would), none finished
    std::vector<float> h(static_cast<size_t>((B + 1) * hidden), 0.0f);
    CounterRng rng(5, 1);
    for (int64_t i = 0; i < B * hidden; ++i) h[size_t(i)] = float(rng.symmetric(uint64_t(i)));
    CUDA_CHECK(cudaMemcpy(x, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  StepBatch b;
  b.seqs.resize(size_t(B));
  auto step = [&](int i) {  // one decode step of every sequence at position C + i
    for (int64_t s = 0; s < B; ++s)
      b.seqs[size_t(s)] = BatchSeq{s, int32_t(s), int32_t(C + i), 1, r.is_last() ? i : -1, true};
    if (r.is_first()) st.embed_batch(b, nullptr, tokens, x);
    st.forward_batch(x, b);
    if (r.is_last()) st.choose_batch(x, b, nullptr, tokens, nullptr);
  };
  const int total = steps + 3;
  std::vector<double> t = event_times(st, total, step);
  t.erase(t.begin(), t.begin() + 3);
  if (trace_json) {  // three more steps, traced; the middle one reported (the host ahead of the GPU, as in a run)
    auto k = trace_kernels([&] {
      for (int i = total; i < total + 3; ++i) step(i);
    });
    std::vector<size_t> starts;  // each step begins with its embedding
    for (size_t i = 0; i < k.size(); ++i)
      if (k[i].name.find("embedding") != std::string::npos) starts.push_back(i);
    if (starts.size() == 3) k = std::vector<KernelRecord>(k.begin() + long(starts[1]), k.begin() + long(starts[2]));
    report_trace(k, trace_json);
  }
  Timing tm;
  for (double v : t) tm.mean += v / double(t.size());
  std::sort(t.begin(), t.end());
  tm.median = t[t.size() / 2];
  tm.p99 = t[std::min(t.size() - 1, size_t(double(t.size()) * 0.99))];
  return tm;
}

// ms of each of `reps` runs of item queued back to back (events between them, the host never
// waiting) after one untimed, sorted.
template <class Item>
std::vector<double> sorted_times(CudaStageExecutor& st, int reps, Item&& item) {
  if (reps < 1) throw std::runtime_error(cat("cuda_bench_step: reps ", reps, " (at least 1)"));
  item();
  std::vector<double> t = event_times(st, reps, [&](int) { item(); });
  std::sort(t.begin(), t.end());
  return t;
}

// The prefill of one prompt of n rows through the whole model, as a static run's prefill item
// goes (embed_batch of its ids, forward_batch storing its cache in pages of 64, the greedy choice
// of its first token): the median of `reps` back to back after one untimed, then one traced (the
// time per kernel name: where a prefill item's time goes) into json.
void bench_prefill(CudaStageExecutor& st, const ModelConfig& c, int64_t n, int reps, const std::string& json) {
  const int64_t page = 64, max_pages = (n + page - 1) / page;
  st.alloc_batch_state({1, max_pages, page, max_pages}, SamplingParams{});
  std::vector<int32_t> pages(static_cast<size_t>(max_pages));
  for (int64_t i = 0; i < max_pages; ++i) pages[size_t(i)] = int32_t(i);
  st.map_pages(0, 0, pages.data(), max_pages);
  void* x = st.alloc_hidden(n + 1);
  int32_t* tokens = st.alloc_tokens(1);
  auto* ids = static_cast<int32_t*>(st.alloc_host(n * 4));
  CounterRng rng(5, 5);
  for (int64_t i = 0; i < n; ++i) ids[i] = int32_t(rng.bits(uint64_t(i)) % uint64_t(c.vocab_size));
  StepBatch b;
  b.seqs = {BatchSeq{0, 0, 0, int32_t(n), 0, false}};
  auto item = [&] {
    st.embed_batch(b, ids, nullptr, x);
    st.forward_batch(x, b);
    st.choose_batch(x, b, nullptr, tokens, nullptr);
  };
  const std::vector<double> t = sorted_times(st, reps, item);
  std::printf("prefill of one %lld-row prompt (embed, %lld layers, head): %.3f ms (min %.3f, max %.3f), %.0f "
              "tokens/s\n",
              (long long)n, (long long)c.num_hidden_layers, t[t.size() / 2], t.front(), t.back(),
              double(n) / t[t.size() / 2] * 1e3);
  report_trace(trace_kernels(item), json, 40);
}

// A scoring run's microbatch (no cache, no generation): n_seq prompts of seq_len rows through every
// layer as one forward (embedded once before), the median of `reps` back to back after one untimed,
// then one traced into json (the time per kernel name: where a scoring item's time goes).
void bench_score(CudaStageExecutor& st, const ModelConfig& c, int64_t n_seq, int64_t seq_len, int reps,
                 const std::string& json) {
  const int64_t n = n_seq * seq_len;
  void* x = st.alloc_hidden(n);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  CounterRng rng(5, 5);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(rng.bits(uint64_t(i)) % uint64_t(c.vocab_size));
  st.embed(ids.data(), n_seq, seq_len, x);
  auto item = [&] { st.forward(x, n_seq, seq_len); };
  const std::vector<double> t = sorted_times(st, reps, item);
  std::printf("scoring forward of %lld x %lld rows (%lld layers): %.3f ms (min %.3f, max %.3f), %.0f tokens/s\n",
              (long long)n_seq, (long long)seq_len, (long long)c.num_hidden_layers, t[t.size() / 2], t.front(),
              t.back(), double(n) / t[t.size() / 2] * 1e3);
  report_trace(trace_kernels(item), json, 40);
}

std::vector<std::pair<int64_t, int64_t>> parse_cases(const std::string& s) {
  std::vector<std::pair<int64_t, int64_t>> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t x = item.find('x');
    out.emplace_back(std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1)));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cuda_bench_step MODEL.h5 [BxC,...] [steps] [layers] | MODEL.h5 prefill [rows] [reps] | "
                         "MODEL.h5 score [SEQSxLEN] [reps]\n");
    return 1;
  }
  try {
    WeightReader reader(argv[1]);
    const ModelConfig& c = reader.config();
    if (argc > 2 && std::string(argv[2]) == "prefill") {
      auto st = make_cuda_stage(reader, whole_model(int(c.num_hidden_layers)), DType::BF16, 0);
      const char* out_dir = std::getenv("OUT");
      bench_prefill(*st, c, argc > 3 ? std::atoll(argv[3]) : 8192, argc > 4 ? std::atoi(argv[4]) : 5,
                    std::string(out_dir ? out_dir : ".") + "/prefill_trace.json");
      return 0;
    }
    if (argc > 2 && std::string(argv[2]) == "score") {
      const auto shape = parse_cases(argc > 3 ? argv[3] : "256x32").at(0);
      if (shape.first < 1 || shape.second < 1)
        throw std::runtime_error(cat("cuda_bench_step score: ", argv[3], " (SEQSxLEN, both at least 1)"));
      // "apart": the FP8 experts' SwiGLU as its own launch, not in gate/up's epilogue (the comparison)
      const char* swiglu = std::getenv("LFM2_BENCH_SWIGLU");
      cuda::grouped::set_fp8_swiglu_fused(!(swiglu && std::string(swiglu) == "apart"));
      auto st = make_cuda_stage(reader, whole_model(int(c.num_hidden_layers)), DType::BF16, 0);
      const char* out_dir = std::getenv("OUT");
      bench_score(*st, c, shape.first, shape.second, argc > 4 ? std::atoi(argv[4]) : 5,
                  std::string(out_dir ? out_dir : ".") + "/score_trace.json");
      return 0;
    }
    const auto cases = parse_cases(argc > 2 ? argv[2] : "32x1024,32x4096,32x8192,32x16384,256x64");
    const int steps = argc > 3 ? std::atoi(argv[3]) : 20;
    const bool per_layer = argc > 4 && std::string(argv[4]) == "layers";
    const char* kv_env = std::getenv("LFM2_BENCH_KV");  // "fp8": the steps on an fp8 cache (--kv-dtype fp8)
    const bool kv_fp8 = kv_env && std::string(kv_env) == "fp8";
    bench_copy();
    const int L = int(c.num_hidden_layers);
    std::printf("model %s: %d layers, bf16%s%s, one stage; ms per decode step (embed + layers + head + greedy "
                "choice)\n",
                argv[1], L, c.fp8.on ? ", e4m3 experts" : "", kv_fp8 ? ", fp8 KV cache" : "");
    {
      const StageLayers all = whole_model(L);
      auto st = make_cuda_stage(reader, all, DType::BF16, 0, false, true, 0, kv_fp8);
      const char* out_dir = std::getenv("OUT");
      const std::string json = std::string(out_dir ? out_dir : ".") + "/step_trace.json";
      for (auto [B, C] : cases) {
        const bool trace = B == cases[0].first && C == cases[0].second;
        const Timing t = time_steps(*st, all, c.hidden_size, B, C, steps, trace ? json.c_str() : nullptr);
        const Floor f = floor_bytes(c, 0, L, true, true, B, C, kv_fp8);
        const double floor_ms = (f.weights + f.kv) / g_copy_gbs * 1e-6;
        std::printf("step B=%-4lld C=%-6lld %8.3f ms (mean %.3f, p99 %.3f)  %7.0f tok/s  floor %.3f ms "
                    "(weights %.2f GB + KV %.2f GB)  %3.0f%% of floor\n",
                    (long long)B, (long long)C, t.median, t.mean, t.p99, double(B) / t.median * 1e3, floor_ms,
                    f.weights * 1e-9, f.kv * 1e-9, 100 * floor_ms / t.median);
      }
    }
    if (!per_layer) return 0;
    // one layer of each kind (its first occurrence) as a middle stage
    std::vector<int> firsts;
    std::vector<std::string> kinds;
    for (int il = 0; il < L; ++il) {
      const std::string k = std::string(c.is_attention(il) ? "attention" : "conv") + (c.is_moe(il) ? "+moe" : "+dense");
      if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k), firsts.push_back(il);
    }
    for (size_t i = 0; i < kinds.size(); ++i) {
      const StageLayers r{1, 3, firsts[i], firsts[i] + 1};  // a middle stage
      auto st = make_cuda_stage(reader, r, DType::BF16, 0, false, true, 0, kv_fp8);
      for (auto [B, C] : cases) {
        const Timing t = time_steps(*st, r, c.hidden_size, B, C, steps);
        const Floor f = floor_bytes(c, r.layer_begin, r.layer_end, false, false, B, C, kv_fp8);
        const double floor_ms = (f.weights + f.kv) / g_copy_gbs * 1e-6;
        std::printf("layer %-16s B=%-4lld C=%-6lld %8.4f ms  floor %.4f ms  %3.0f%% of floor\n", kinds[i].c_str(),
                    (long long)B, (long long)C, t.median, floor_ms, 100 * floor_ms / t.median);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
