// Fixture tool of the continuous-batching tests (tests/rank/CMakeLists.txt, issue 20):
//   batch_test_files workload OUT.h5 VOCAB N           the 20,000-prompt shape scaled down: N prompts of
//                                                      2-64 ids, max_new_tokens 1-32, long-tailed, seeded
//   batch_test_files params DIR                        from DIR/ragged.h5: ragged_params.h5 (per-sequence
//                                                      parameters, some -1), bad_top_p.h5, bad_max_new.h5
//   batch_test_files with-max-new IN.h5 OUT.h5         IN's prompts with max_new_tokens 1 + 5s mod 8 (-1
//                                                      for every seventh: the flag's)
//   batch_test_files truncated-match OUT.h5 GOLD.h5 K  each sequence's tokens are GOLD's first n, n its own
//                                                      max_new_tokens (K: the flag's)
//   batch_test_files redone FULL.log KILL RESUMED.log   the resumed run's steps + the killed run's
//                                                      KILL over the full run's, minus 1: the work redone
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "io/seq_params.h"
#include "io/token_files.h"

using namespace lfm2;

namespace {

uint32_t lcg(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return uint32_t(s >> 33);
}

// A long-tailed draw in [lo, hi]: uniform in log space (median sqrt(lo * hi), a tail to hi).
int32_t long_tailed(uint64_t& s, int32_t lo, int32_t hi) {
  const double u = double(lcg(s)) / 2147483648.0;  // lcg gives 31 bits
  return int32_t(std::lround(double(lo) * std::pow(double(hi) / double(lo), u)));
}

void workload(const std::string& out, int32_t vocab, int64_t n) {
  uint64_t seed = 20000;
  TokenInputs in{n, 64, {}, {}};
  SeqParamsBlock p;
  p.n = n;
  for (int64_t s = 0; s < n; ++s) {
    const int32_t len = long_tailed(seed, 2, 64);
    in.lengths.push_back(len);
    p.max_new_tokens.push_back(long_tailed(seed, 1, 32));
    for (int32_t t = 0; t < 64; ++t) in.ids.push_back(t < len ? int32_t(lcg(seed) % uint32_t(vocab)) : 0);
  }
  write_inputs(out, in);
  write_seq_params(out, p);
}

void params(const std::string& dir) {
  const TokenInputs r = read_inputs(dir + "/ragged.h5");
  SeqParamsBlock p;
  p.n = r.n_seq;
  p.max_new_tokens = {3, 20, 1, -1, 12, 7};
  p.temperature = {0.8f, -1, 0, 1.5f, 0.5f, -1};
  p.top_k = {50, 0, -1, 7, -1, 3};
  p.top_p = {0.9f, 1, -1, 0.5f, 0.95f, -1};
  p.seed = {42, 7, -1, 1234567890123, 0, 5};
  write_inputs(dir + "/ragged_params.h5", r);
  write_seq_params(dir + "/ragged_params.h5", p);
  SeqParamsBlock bad = p;
  bad.top_p[3] = 2;
  write_inputs(dir + "/bad_top_p.h5", r);
  write_seq_params(dir + "/bad_top_p.h5", bad);
  bad = p;
  bad.max_new_tokens[4] = 0;
  write_inputs(dir + "/bad_max_new.h5", r);
  write_seq_params(dir + "/bad_max_new.h5", bad);
}

void with_max_new(const std::string& in_path, const std::string& out) {
  const TokenInputs in = read_inputs(in_path);
  SeqParamsBlock p;
  p.n = in.n_seq;
  for (int64_t s = 0; s < in.n_seq; ++s) p.max_new_tokens.push_back(s % 7 == 6 ? -1 : int32_t(1 + (5 * s) % 8));
  write_inputs(out, in);
  write_seq_params(out, p);
}

int truncated_match(const std::string& out, const std::string& gold, const std::string& params, int64_t K) {
  const TokenOutputs o = read_outputs(out);
  const TokenAnswers g = read_answers(gold);
  const SeqParamsBlock p = read_seq_params(params, 0, o.n_seq);
  int64_t differ = 0, total = 0;
  for (int64_t s = 0; s < o.n_seq; ++s) {
    const int64_t want = p.max_new_tokens[size_t(s)] == -1 ? K : p.max_new_tokens[size_t(s)];
    if (o.n_generated[size_t(s)] != want) {
      std::printf("sequence %lld: %d tokens, its max_new_tokens is %lld\n", (long long)s, o.n_generated[size_t(s)],
                  (long long)want);
      ++differ;
    }
    for (int64_t t = 0; t < want; ++t, ++total)
      differ += o.generated[size_t(s * o.n_new + t)] != g.generated[size_t(s * g.n_new + t)];
  }
  std::printf("%lld of %lld tokens differ\n", (long long)differ, (long long)total);
  return differ ? 1 : 0;
}

int64_t steps_of(const std::string& log) {
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  std::smatch m;
  const std::string text = ss.str();
  LFM2_CHECK(std::regex_search(text, m, std::regex("continuous: ([0-9]+) steps")), log, ": no 'continuous:' line");
  return std::stoll(m[1]);
}

int redone(const std::string& full, int64_t kill, const std::string& resumed) {
  const int64_t s = steps_of(full), r = steps_of(resumed);
  const double frac = double(kill + r - s) / double(s);
  std::printf("full run %lld steps, killed after %lld, resumed %lld: %.1f%% of the work redone\n", (long long)s,
              (long long)kill, (long long)r, 100 * frac);
  return frac <= 0.05 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fixture tool of the continuous-batching tests"};
  app.require_subcommand(1);
  std::string a, b, c;
  int64_t n = 0, k = 0;
  int32_t vocab = 0;
  auto* wl = app.add_subcommand("workload", "the 20,000-prompt shape scaled down");
  wl->add_option("out", a)->required();
  wl->add_option("vocab", vocab)->required();
  wl->add_option("n", n)->required();
  auto* pr = app.add_subcommand("params", "ragged prompts with per-sequence parameters, and bad ones");
  pr->add_option("dir", a)->required();
  auto* wm = app.add_subcommand("with-max-new", "prompts with per-sequence max_new_tokens");
  wm->add_option("in", a)->required();
  wm->add_option("out", b)->required();
  auto* tm = app.add_subcommand("truncated-match", "tokens equal the golden ones up to each max_new_tokens");
  tm->add_option("out", a)->required();
  tm->add_option("gold", b)->required();
  tm->add_option("params", c)->required();
  tm->add_option("k", k)->required();
  auto* rd = app.add_subcommand("redone", "the share of work a resumed run did again");
  rd->add_option("full", a)->required();
  rd->add_option("kill", k)->required();
  rd->add_option("resumed", b)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*wl) workload(a, vocab, n);
    if (*pr) params(a);
    if (*wm) with_max_new(a, b);
    if (*tm) return truncated_match(a, b, c, k);
    if (*rd) return redone(a, k, b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batch_test_files: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
