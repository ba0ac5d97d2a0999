// Stage timings at full LFM2-8B-A1B width (not a test): synthesizes the first n layers of the
// full-size preset (default 6: two dense conv layers, then MoE layers with attention at layer 2),
// then times one layer of each kind and the whole range on the CUDA stage, for each dtype, with a
// microbatch of n_seq x seq_len tokens. From the per-kind times it extrapolates the 24-layer forward.
//   cuda_bench_stage [work_dir] [n_seq] [seq_len]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/rng.h"
#include "h5pack/presets.h"
#include "h5pack/synth.h"
#include "io/weight_file.h"
#include "model/cuda_stage.h"

using namespace lfm2;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median of reps timed forwards (events on the stage's stream), after one warm-up.
double time_forward(CudaStageExecutor& st, void* x, const std::vector<int32_t>& ids, int64_t n_seq, int64_t seq_len,
                    bool first, int reps = 5) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i <= reps; ++i) {
    if (first) st.embed(ids.data(), n_seq, seq_len, x);
    st.record_event(a);
    st.forward(x, n_seq, seq_len);
    st.record_event(b);
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i > 0) t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  const int64_t n_seq = argc > 2 ? std::stoll(argv[2]) : 1024, seq_len = argc > 3 ? std::stoll(argv[3]) : 32;
  const int n_layers = 6;
  ModelConfig cfg = synth_preset("lfm2-8b-a1b");
  cfg.num_hidden_layers = n_layers;
  cfg.layer_types.resize(n_layers);
  cfg.validate("bench config");
  const std::string path = dir + "/bench_8b_first6_bf16.h5";
  double t0 = now_s();
  SynthOptions opt;
  opt.seed = 1;
  opt.dtype = DType::BF16;
  opt.progress = false;
  synth_weights(cfg, path, opt);
  std::printf("synth %d full-width layers: %.1f s\n", n_layers, now_s() - t0);
  WeightReader reader(path);
  const int64_t T = n_seq * seq_len;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  CounterRng rng(5, 5);
  for (int64_t i = 0; i < T; ++i) ids[i] = int32_t(rng.bits(uint64_t(i)) % uint64_t(cfg.vocab_size));

  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    struct Part {
      const char* name;
      int b, e;
      int count_in_24;  // layers of this kind in the full model
    };
    // layer 0: conv + dense; layer 2: attention + MoE; layer 3: conv + MoE
    const Part parts[] = {{"conv+dense", 0, 1, 2}, {"attn+moe", 2, 3, 6}, {"conv+moe", 3, 4, 16}};
    double est = 0;
    for (const Part& p : parts) {
      t0 = now_s();
      auto st = make_cuda_stage(reader, {p.b, p.e, true, false}, dt, 0);
      const double load = now_s() - t0;
      void* x = st->alloc_hidden(T);
      const double ms = time_forward(*st, x, ids, n_seq, seq_len, true);
      est += ms * p.count_in_24;
      std::printf("%-4s %-10s layer %d: %8.2f ms per %lldx%lld microbatch (load+upload %.1f s)\n", dtype_name(dt),
                  p.name, p.b, ms, (long long)n_seq, (long long)seq_len, load);
    }
    // the head: final norm + LM head of the last positions
    auto st = make_cuda_stage(reader, {n_layers - 1, n_layers, false, true}, dt, 0);
    void* x = st->alloc_hidden(T);
    CUDA_CHECK(cudaMemset(x, 0, size_t(T * cfg.hidden_size) * 4));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> logits(static_cast<size_t>(n_seq * cfg.vocab_size));
    HeadOutputs head;
    head.logits = logits.data();
    st->head(x, n_seq, seq_len, nullptr, head);
    st->synchronize();
    t0 = now_s();
    st->head(x, n_seq, seq_len, nullptr, head);
    st->synchronize();
    const double head_ms = (now_s() - t0) * 1e3;
    est += head_ms;
    std::printf("%-4s head (last positions, incl. copy to host): %.2f ms\n", dtype_name(dt), head_ms);
    std::printf("%-4s estimated 24-layer forward + head on one GPU: %.1f ms per %lld samples = %.0f samples/s\n",
                dtype_name(dt), est, (long long)n_seq, double(n_seq) / est * 1e3);
  }
  return 0;
}
