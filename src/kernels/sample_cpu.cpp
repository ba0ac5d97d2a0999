// Token choice on the CPU, one row per work item. Sampling sorts the candidates by (logit
// descending, index ascending), so ties are broken the same way everywhere; probabilities are
// exp((z - max) / T) in double, normalised over the kept candidates.
#include "kernels/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/parallel.h"
#include "common/rng.h"
#include "kernels/argmax.h"

namespace lfm2::cpu {
namespace {

int32_t draw(const float* z, int64_t vocab, const SamplingParams& p, double u) {
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    const bool an = z[a] != z[a], bn = z[b] != z[b];  // NaN last
    if (an != bn) return bn;
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  };
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
  idx.resize(size_t(k));
  std::vector<double> prob(idx.size());
  const double mx = z[idx[0]];
  double total = 0;
  for (size_t i = 0; i < idx.size(); ++i) total += prob[i] = std::exp((double(z[idx[i]]) - mx) / p.temperature);
  // top-p: the smallest prefix whose share reaches p (at least one candidate)
  size_t keep = idx.size();
  if (p.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      cum += prob[i];
      if (cum >= double(p.top_p) * total) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += prob[i];
  const double target = u * kept;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (target < cum) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace

double sampling_uniform(uint64_t seed, int64_t sequence, int64_t step) {
  return double(CounterRng(seed, uint64_t(sequence)).bits(uint64_t(step)) >> 11) * 0x1.0p-53;
}

void choose_tokens(int32_t* tokens, const float* logits, int64_t n_rows, int64_t vocab, const int64_t* seq_ids,
                   int64_t step, const SamplingParams& params, int32_t* ended, int n_threads) {
  parallel_for(n_rows, n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = seq_ids[i];
      const float* row = logits + i * vocab;
      int32_t t;
      if (ended && ended[s] != kNotEnded) {
        t = ended[s];
      } else if (params.greedy()) {
        argmax(&t, row, 1, vocab);
      } else {
        t = draw(row, vocab, params, sampling_uniform(params.seed, params.first_sequence + s, step));
      }
      if (ended && ended[s] == kNotEnded && std::find(params.eos.begin(), params.eos.end(), t) != params.eos.end())
        ended[s] = t;
      tokens[i] = t;
    }
  }, 1);
}

void finished_flags(float* flags, const int32_t* tokens, int64_t n, const std::vector<int32_t>& eos) {
  for (int64_t i = 0; i < n; ++i)
    flags[i] = std::find(eos.begin(), eos.end(), tokens[i]) != eos.end() ? 1.0f : 0.0f;
}

}  // namespace lfm2::cpu
