// Stage timings at full LFM2-8B-A1B width (not a test): synthesizes the first 6 layers of the
// full-size preset (two dense conv layers, then MoE layers with attention at layer 2; kept in
// work_dir and reused), then times one layer of each kind (conv + dense, attention + MoE,
// conv + MoE) and the head on the CUDA stage, for each dtype and each microbatch shape, printing
// ms, TFLOP/s (2 * m * n * k of every product, attention's causal half) and the fraction of the
// dense bf16 GEMM peak measured in the same process. From the per-kind times it extrapolates the
// 24-layer forward.
//   cuda_bench_stage [work_dir] [NxS,NxS,...] [bf16,fp16,fp32]
//   defaults: /tmp 32x32,128x32,512x32,1024x32 bf16,fp16,fp32
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/rng.h"
#include "h5pack/presets.h"
#include "kernels/cuda/ops.h"
#include "h5pack/synth.h"
#include "io/weight_file.h"
#include "model/cuda_stage.h"

using namespace lfm2;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median of reps timed forwards (events on the stage's stream around each), queued back to back
// after one warm-up: the host never waits between them, so its launch work overlaps the device's
// (as in the pipeline) and is not counted. The first stage embeds once, before the warm-up; the
// forwards then keep adding into the same residual (the timing does not depend on its values).
double time_forward(CudaStageExecutor& st, void* x, const std::vector<int32_t>& ids, int64_t n_seq, int64_t seq_len,
                    bool first, int reps = 10) {
  if (first) st.embed(ids.data(), n_seq, seq_len, x);
  st.forward(x, n_seq, seq_len);
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    st.record_event(ev[size_t(2 * i)]);
    st.forward(x, n_seq, seq_len);
    st.record_event(ev[size_t(2 * i + 1)]);
  }
  CUDA_CHECK(cudaEventSynchronize(ev.back()));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    t.push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// FLOPs of one layer per token (2 per multiply-add), attention's causal half at sequence length S.
double layer_flops_per_token(const ModelConfig& c, int il, int64_t S) {
  const double H = double(c.hidden_size), hd = double(c.head_dim()), nh = double(c.num_attention_heads);
  const double nkv = double(c.num_key_value_heads);
  double f = 0;
  if (c.is_attention(il))
    f += 2 * H * (nh + 2 * nkv) * hd + 2 * nh * hd * H + 4 * nh * hd * (double(S) + 1) / 2;
  else
    f += 2 * H * 3 * H + 2 * H * H;
  if (c.is_moe(il))
    f += 2 * H * double(c.num_experts) +
         double(c.num_experts_per_tok) * 3 * 2 * H * double(c.moe_intermediate_size);
  else
    f += 3 * 2 * H * double(c.intermediate_size);
  return f;
}

double dense_peak_tflops() {
  const int64_t n = 8192;
  __nv_bfloat16 *a, *w, *o;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&a), size_t(n * n) * 2));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), size_t(n * n) * 2));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), size_t(n * n) * 2));
  float* tmp;
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&tmp), size_t(n * n) * 4));
  std::vector<float> h(static_cast<size_t>(n * n));
  CounterRng rng(9, 9);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(rng.symmetric(i));
  CUDA_CHECK(cudaMemcpy(tmp, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  cuda::convert_from_f32(a, tmp, n * n, nullptr);
  cuda::convert_from_f32(w, tmp, n * n, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < 13; ++i) {
    CUDA_CHECK(cudaEventRecord(e0, nullptr));
    cuda::linear(o, a, w, n, n, n, nullptr);
    CUDA_CHECK(cudaEventRecord(e1, nullptr));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaFree(a), cudaFree(w), cudaFree(o), cudaFree(tmp);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return 2.0 * n * n * n / t[t.size() / 2] * 1e-9;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// The first n_layers of the full-size model (bf16, seed 1) in dir, synthesized once.
std::string first_layers_file(const ModelConfig& cfg, const std::string& dir, int n_layers) {
  const std::string path = dir + "/bench_8b_first6_bf16.h5";
  if (std::ifstream(path).good()) return path;
  const double t0 = now_s();
  SynthOptions opt;
  opt.seed = 1;
  opt.dtype = DType::BF16;
  opt.progress = false;
  synth_weights(cfg, path, opt);
  std::printf("synth %d full-width layers: %.1f s\n", n_layers, now_s() - t0);
  return path;
}

// The head (final norm + LM head of the last positions, copied to pageable host memory) per shape,
// its time added to est.
void bench_head(WeightReader& reader, const ModelConfig& cfg, DType dt, int n_layers,
                const std::vector<std::pair<int64_t, int64_t>>& shapes, int64_t max_t, std::vector<double>& est) {
  auto st = make_cuda_stage(reader, StageLayers{1, 2, n_layers - 1, n_layers}, dt, 0);
  void* x = st->alloc_hidden(max_t);
  CUDA_CHECK(cudaMemset(x, 0, size_t(max_t * cfg.hidden_size) * 4));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [n_seq, seq_len] = shapes[i];
    std::vector<float> logits(static_cast<size_t>(n_seq * cfg.vocab_size));
    HeadOutputs head;
    head.logits = logits.data();
    st->head(x, n_seq, seq_len, nullptr, head);
    st->synchronize();
    const double t0 = now_s();
    st->head(x, n_seq, seq_len, nullptr, head);
    st->synchronize();
    const double head_ms = (now_s() - t0) * 1e3;
    est[i] += head_ms;
    std::printf("%-4s head (last positions, incl. copy to host) %lldx%lld: %.2f ms\n", dtype_name(dt),
                (long long)n_seq, (long long)seq_len, head_ms);
    std::printf("%-4s estimated 24-layer forward + head on one GPU, microbatch %lldx%lld: %.1f ms = %.0f samples/s\n",
                dtype_name(dt), (long long)n_seq, (long long)seq_len, est[i], double(n_seq) / est[i] * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const std::string& x : split(argc > 2 ? argv[2] : "32x32,128x32,512x32,1024x32")) {
    const size_t p = x.find('x');
    shapes.push_back({std::stoll(x.substr(0, p)), std::stoll(x.substr(p + 1))});
  }
  std::vector<DType> dtypes;
  for (const std::string& x : split(argc > 3 ? argv[3] : "bf16,fp16,fp32")) dtypes.push_back(parse_dtype(x));
  int64_t max_t = 0;
  for (auto [ns, S] : shapes) max_t = std::max(max_t, ns * S);

  const int n_layers = 6;
  ModelConfig cfg = synth_preset("lfm2-8b-a1b");
  cfg.num_hidden_layers = n_layers;
  cfg.layer_types.resize(n_layers);
  cfg.validate("bench config");
  WeightReader reader(first_layers_file(cfg, dir, n_layers));
  std::vector<int32_t> ids(static_cast<size_t>(max_t));
  CounterRng rng(5, 5);
  for (int64_t i = 0; i < max_t; ++i) ids[i] = int32_t(rng.bits(uint64_t(i)) % uint64_t(cfg.vocab_size));
  const double peak = dense_peak_tflops();
  std::printf("dense bf16 GEMM peak (cuBLASLt 8192^3, this process): %.0f TFLOP/s\n", peak);

  struct Part {
    const char* name;
    int b, e;
    int count_in_24;  // layers of this kind in the full model
  };
  // layer 0: conv + dense; layer 2: attention + MoE; layer 3: conv + MoE
  const Part parts[] = {{"conv+dense", 0, 1, 2}, {"attn+moe", 2, 3, 6}, {"conv+moe", 3, 4, 16}};
  for (DType dt : dtypes) {
    std::vector<double> est(shapes.size(), 0.0);
    for (const Part& p : parts) {
      const double t0 = now_s();
      auto st = make_cuda_stage(reader, StageLayers{0, 2, p.b, p.e}, dt, 0);
      const double load = now_s() - t0;
      void* x = st->alloc_hidden(max_t);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const auto [n_seq, seq_len] = shapes[i];
        const double ms = time_forward(*st, x, ids, n_seq, seq_len, true);
        const double fl = layer_flops_per_token(cfg, p.b, seq_len) * double(n_seq * seq_len);
        const double tfl = fl / ms * 1e-9;
        est[i] += ms * p.count_in_24;
        std::printf("%-4s %-10s layer %d: %5lld tok (%lldx%lld) %8.3f ms %5.0f TFLOP/s (%3.0f%% of peak)%s\n",
                    dtype_name(dt), p.name, p.b, (long long)(n_seq * seq_len), (long long)n_seq, (long long)seq_len,
                    ms, tfl, 100 * tfl / peak, i == 0 ? cat(" (load+upload ", int(load), " s)").c_str() : "");
      }
    }
    bench_head(reader, cfg, dt, n_layers, shapes, max_t, est);
  }
  return 0;
}
