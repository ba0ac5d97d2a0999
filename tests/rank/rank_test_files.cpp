// Fixture tool of the MPI tests (tests/rank/CMakeLists.txt): writes their token files and compares
// outputs bit for bit.
//   rank_test_files make DIR MODEL.h5      inputs.h5, ragged prompts and the malformed files next to it
//   rank_test_files isolate PATTERN P      moves each stage file into DIR/<stage>/ alone
//   rank_test_files perturb IN.h5 OUT.h5   answers with one wrong top-1 and logits off by 1
//   rank_test_files same A.h5 B.h5 ...     every file's datasets equal A's, bit for bit
//   rank_test_files check-trace T.json P M  a --trace file of P ranks and M microbatches is whole
//   rank_test_files rows-match R.h5 'S%d.h5' row i of R (ragged prompts) equals prompt i run alone
//   rank_test_files extend IN.h5 GEN.h5 OUT.h5 each prompt + its first t generated tokens, t < K
//   rank_test_files extended-match GEN.h5 SCORED.h5  scoring those gives the generated tokens
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/token_files.h"
#include "io/weight_file.h"

namespace fs = std::filesystem;
using namespace lfm2;

namespace {

// A portable seeded generator (the same ids on every machine).
uint32_t lcg(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return uint32_t(s >> 33);
}

void make(const std::string& dir, const std::string& model) {
  const ModelConfig cfg = WeightReader(model).config();
  uint64_t seed = 2024;
  TokenInputs in{12, 9, {}, {}};
  for (int i = 0; i < 12 * 9; ++i) in.ids.push_back(int32_t(lcg(seed) % uint32_t(cfg.vocab_size)));
  write_inputs(dir + "/inputs.h5", in);
  TokenInputs bad = in;
  bad.ids[5 * 9 + 4] = int32_t(cfg.vocab_size);
  write_inputs(dir + "/bad_token.h5", bad);
  write_inputs(dir + "/empty_seq.h5", TokenInputs{2, 0, {}, {}});
  TokenInputs longer{1, cfg.max_position_embeddings + 1, {}, {}};
  longer.ids.assign(size_t(longer.seq_len), 1);
  write_inputs(dir + "/too_long.h5", longer);
  // Ragged prompts (right-padded with ids outside the vocabulary: padding must never be read), and
  // each prompt alone at its own length.
  TokenInputs ragged{6, 9, {}, {9, 1, 5, 9, 3, 7}};
  for (int64_t s = 0; s < 6; ++s) {
    TokenInputs one{1, ragged.lengths[size_t(s)], {}, {}};
    for (int64_t p = 0; p < 9; ++p) {
      const bool pad = p >= ragged.lengths[size_t(s)];
      ragged.ids.push_back(pad ? int32_t(cfg.vocab_size + 7) : in.ids[size_t(s * 9 + p)]);
      if (!pad) one.ids.push_back(in.ids[size_t(s * 9 + p)]);
    }
    write_inputs(dir + "/single_" + std::to_string(s) + ".h5", one);
  }
  write_inputs(dir + "/ragged.h5", ragged);
  // Seven ragged prompts: three replicas get uneven blocks (2, 2, 3 by tokens), the last block's
  // longest prompt (7) shorter than the inputs' width.
  TokenInputs seven = ragged;
  seven.n_seq = 7;
  seven.lengths.push_back(2);
  for (int64_t p = 0; p < 9; ++p) seven.ids.push_back(p < 2 ? in.ids[size_t(6 * 9 + p)] : int32_t(cfg.vocab_size + 7));
  write_inputs(dir + "/seven.h5", seven);
  TokenOutputs short_answers;
  short_answers.n_seq = 11;
  short_answers.next_token.assign(11, 0);
  write_outputs(dir + "/answers_short.h5", short_answers, nlohmann::json::object());
  // A weight file cut short, as an interrupted copy leaves it.
  std::ifstream src(model, std::ios::binary);
  std::vector<char> head(size_t(fs::file_size(model) / 2));
  src.read(head.data(), std::streamsize(head.size()));
  std::ofstream(dir + "/corrupt.h5", std::ios::binary).write(head.data(), std::streamsize(head.size()));
}

void isolate(const std::string& pattern, int n_stages) {
  const size_t pos = pattern.find("%d");
  LFM2_CHECK(pos != std::string::npos, pattern, ": needs %d");
  for (int s = 0; s < n_stages; ++s) {
    const fs::path file = pattern.substr(0, pos) + std::to_string(s) + pattern.substr(pos + 2);
    const fs::path dir = file.parent_path() / std::to_string(s);
    fs::create_directories(dir);
    fs::rename(file, dir / file.filename());
  }
}

void perturb(const std::string& in, const std::string& out) {
  TokenOutputs o = read_outputs(in);
  o.all_logits.clear();
  o.next_token[0] = int32_t((o.next_token[0] + 1) % o.vocab);
  for (int64_t v = 0; v < o.vocab; ++v) o.logits[size_t(v)] += 1.0f;
  write_outputs(out, o, nlohmann::json::object());
}

template <typename T>
bool bits_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

int same(const std::vector<std::string>& files) {
  const TokenOutputs ref = read_outputs(files[0]);
  LFM2_CHECK(!ref.next_token.empty() && (!ref.logits.empty() || !ref.generated.empty()), files[0], ": no results");
  int bad = 0;
  for (size_t i = 1; i < files.size(); ++i) {
    const TokenOutputs o = read_outputs(files[i]);
    const bool ok = bits_equal(o.next_token, ref.next_token) && bits_equal(o.logits, ref.logits) &&
                    bits_equal(o.generated, ref.generated) && bits_equal(o.n_generated, ref.n_generated) &&
                    (o.margin.empty() || ref.margin.empty() || bits_equal(o.margin, ref.margin)) &&
                    (o.all_logits.empty() || ref.all_logits.empty() || bits_equal(o.all_logits, ref.all_logits));
    std::printf("%s %s: %s\n", ok ? "same" : "DIFFERENT", files[i].c_str(),
                !o.generated.empty()    ? "generated, n_generated"
                : o.all_logits.empty() ? "next_token, logits"
                                       : "next_token, logits, all_logits");
    bad += ok ? 0 : 1;
  }
  std::printf("%zu files compared with %s: %d differ\n", files.size() - 1, files[0].c_str(), bad);
  return bad ? 1 : 0;
}

// Generation against scoring: for each sequence s and step t, the prompt followed by its first t
// generated tokens (one ragged inputs file of N * K prompts, t-major within s) ...
void extend(const std::string& inputs, const std::string& generated, const std::string& out) {
  const TokenInputs in = read_inputs(inputs);
  const TokenOutputs gen = read_outputs(generated);
  const int64_t K = gen.n_new;
  LFM2_CHECK(K > 0 && gen.n_seq == in.n_seq, generated, ": no generated tokens for ", inputs);
  TokenInputs ext{in.n_seq * K, in.seq_len + K - 1, {}, {}};
  for (int64_t s = 0; s < in.n_seq; ++s)
    for (int64_t t = 0; t < K; ++t) {
      std::vector<int32_t> row(in.ids.begin() + s * in.seq_len, in.ids.begin() + s * in.seq_len + in.length(s));
      for (int64_t j = 0; j < t; ++j) row.push_back(gen.generated[size_t(s * K + j)]);
      ext.lengths.push_back(int32_t(row.size()));
      row.resize(size_t(ext.seq_len), 0);
      ext.ids.insert(ext.ids.end(), row.begin(), row.end());
    }
  write_inputs(out, ext);
}

// ... whose scored next tokens (scored.h5) must be the generated ones: a token decoded against the
// KV cache and conv state is the token a prefill of the longer prompt gives.
int extended_match(const std::string& generated, const std::string& scored) {
  const TokenOutputs gen = read_outputs(generated), sc = read_outputs(scored);
  const int64_t K = gen.n_new;
  LFM2_CHECK(sc.n_seq == gen.n_seq * K, scored, ": ", sc.n_seq, " results for ", gen.n_seq, " x ", K);
  int64_t bad = 0;
  for (int64_t i = 0; i < sc.n_seq; ++i)
    if (sc.next_token[size_t(i)] != gen.generated[size_t(i)]) {
      if (bad++ < 5)
        std::printf("sequence %lld, token %lld: generated %d, scored %d\n", (long long)(i / K), (long long)(i % K + 1),
                    gen.generated[size_t(i)], sc.next_token[size_t(i)]);
    }
  std::printf("%lld of %lld generated tokens differ from scoring the extended prompts\n", (long long)bad,
              (long long)sc.n_seq);
  return bad ? 1 : 0;
}

// --eos ids: every sequence of OUT equals GREEDY up to and including its first token among `eos`,
// then repeats that token (whichever of the ids it was); n_generated counts up to it (K where none).
int eos_check(const std::string& greedy, const std::string& out, const std::vector<int32_t>& eos) {
  const TokenOutputs g = read_outputs(greedy), o = read_outputs(out);
  const int64_t K = g.n_new;
  int bad = 0, stopped = 0;
  int64_t skipped = 0;
  std::map<int32_t, int> ended_with;
  for (int64_t s = 0; s < g.n_seq; ++s) {
    int64_t stop = K;
    int32_t last = -1;
    for (int64_t t = 0; t < K && stop == K; ++t)
      if (std::find(eos.begin(), eos.end(), g.generated[size_t(s * K + t)]) != eos.end()) {
        stop = t + 1;
        last = g.generated[size_t(s * K + t)];
      }
    bool ok = o.n_generated[size_t(s)] == stop;
    for (int64_t t = 0; t < K; ++t)
      ok = ok && o.generated[size_t(s * K + t)] == (t < stop ? g.generated[size_t(s * K + t)] : last);
    stopped += stop < K ? 1 : 0;
    skipped += K - stop;
    if (stop < K) ++ended_with[last];
    if (!ok) std::printf("sequence %lld: wrong after its EOS (n_generated %d, expected %lld)\n", (long long)s,
                         o.n_generated[size_t(s)], (long long)stop);
    bad += ok ? 0 : 1;
  }
  for (const auto& [id, count] : ended_with) std::printf("eos %d: %d sequences ended with it\n", id, count);
  std::printf("%d of %lld sequences stopped early, %d wrong\n", stopped, (long long)g.n_seq, bad);
  // the line the last rank reports for the decode steps that left out the experts
  std::printf("expect: %d of %lld sequences ended at an EOS before %lld tokens; %lld of %lld decode sequence-steps "
              "left out the experts\n",
              stopped, (long long)g.n_seq, (long long)K, (long long)skipped, (long long)(g.n_seq * (K - 1)));
  // every listed id must have ended a sequence early, or the run did not test the rule for it
  return bad || int(ended_with.size()) != int(eos.size()) ? 1 : 0;
}

// Two EOS ids for --eos X --eos Y from a greedy run: X is sequence 0's second token; Y another token
// that some sequence produces before any X with steps left after it, so that it ends with the id
// listed second. Prints "X Y".
int eos_pick(const std::string& greedy) {
  const TokenOutputs g = read_outputs(greedy);
  const int64_t K = g.n_new;
  LFM2_CHECK(K >= 3, greedy, ": needs at least 3 new tokens");
  const int32_t x = g.generated[1];
  for (int64_t s = 1; s < g.n_seq; ++s)
    for (int64_t t = 0; t + 1 < K; ++t) {
      const int32_t y = g.generated[size_t(s * K + t)];
      if (y == x) break;                                       // this sequence ends with X
      if (y == g.generated[0] || y == g.generated[1]) continue;  // sequence 0 must end with X
      std::printf("%d %d\n", x, y);
      return 0;
    }
  LFM2_FAIL(greedy, ": no second EOS id found");
}

// Row i of a ragged run's outputs equals row 0 of `pattern` with %d = i (the prompt run alone), bit
// for bit: next_token, margin and the last position's logits.
int rows_match(const std::string& ragged, const std::string& pattern) {
  const TokenOutputs all = read_outputs(ragged);
  const size_t pos = pattern.find("%d");
  LFM2_CHECK(pos != std::string::npos, pattern, ": needs %d");
  int bad = 0;
  for (int64_t i = 0; i < all.n_seq; ++i) {
    const TokenOutputs one = read_outputs(pattern.substr(0, pos) + std::to_string(i) + pattern.substr(pos + 2));
    const int64_t V = all.vocab;
    const bool ok = one.next_token[0] == all.next_token[size_t(i)] && one.margin[0] == all.margin[size_t(i)] &&
                    std::memcmp(one.logits.data(), all.logits.data() + i * V, size_t(V) * sizeof(float)) == 0;
    std::printf("sequence %lld: %s\n", (long long)i, ok ? "same as alone" : "DIFFERENT");
    bad += ok ? 0 : 1;
  }
  return bad ? 1 : 0;
}

// A --trace file: valid JSON, one named process per rank with its tracks, every X event on a known
// rank and track, each rank's compute spans in time order without overlap, "forward m<k>" for every
// microbatch k once and in order (embed on the first rank, head on the last), no temporary file left.
int check_trace(const std::string& path, int n_ranks, int n_micro) {
  std::ifstream in(path);
  LFM2_CHECK(in.good(), path, ": missing");
  const nlohmann::json doc = nlohmann::json::parse(in);
  const auto& events = doc.at("traceEvents");
  std::vector<int> named(static_cast<size_t>(n_ranks), 0);
  std::vector<std::vector<std::pair<double, double>>> compute(static_cast<size_t>(n_ranks));
  std::vector<std::map<std::string, std::vector<int64_t>>> steps(static_cast<size_t>(n_ranks));
  int spans = 0;
  for (const auto& e : events) {
    const int pid = e.at("pid").get<int>();
    LFM2_CHECK(pid >= 0 && pid < n_ranks, path, ": event of rank ", pid);
    if (e.at("ph") == "M" && e.at("name") == "process_name") ++named[size_t(pid)];
    if (e.at("ph") != "X") continue;
    ++spans;
    const int tid = e.at("tid").get<int>();
    LFM2_CHECK(tid >= 0 && tid <= 3, path, ": track ", tid);
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    LFM2_CHECK(dur >= 0, path, ": negative duration");
    if (tid != 0) continue;
    compute[size_t(pid)].emplace_back(ts, ts + dur);
    const std::string name = e.at("name").get<std::string>();
    steps[size_t(pid)][name.substr(0, name.find(' '))].push_back(e.at("args").at("microbatch").get<int64_t>());
  }
  for (int r = 0; r < n_ranks; ++r) {
    LFM2_CHECK(named[size_t(r)] == 1, path, ": rank ", r, " has ", named[size_t(r)], " process names");
    const auto& c = compute[size_t(r)];
    for (size_t i = 1; i < c.size(); ++i)
      LFM2_CHECK(c[i - 1].second <= c[i].first + 1.0, path, ": rank ", r, " compute spans overlap or are out of order");
    std::vector<std::string> kinds = {"forward"};
    if (r == 0) kinds.push_back("embed");
    if (r == n_ranks - 1) kinds.push_back("head");
    for (const std::string& k : kinds) {
      const auto& ms = steps[size_t(r)][k];
      LFM2_CHECK(int(ms.size()) == n_micro, path, ": rank ", r, " has ", ms.size(), " ", k, " spans for ", n_micro,
                 " microbatches");
      for (int m = 0; m < n_micro; ++m) LFM2_CHECK(ms[size_t(m)] == m, path, ": rank ", r, " ", k, " out of order");
    }
  }
  for (const auto& f : fs::directory_iterator(fs::path(path).parent_path()))
    LFM2_CHECK(f.path().filename().string().rfind(fs::path(path).filename().string() + ".tmp.", 0) != 0, path,
               ": temporary file left: ", f.path().string());
  std::printf("%s: %d ranks, %d spans, %d microbatches each, compute in order\n", path.c_str(), n_ranks, spans,
              n_micro);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fixture tool of the lfm2-rank MPI tests"};
  app.require_subcommand(1);
  std::string dir, model, a, b;
  int n = 0;
  std::vector<std::string> files;
  auto* mk = app.add_subcommand("make", "write the test token files");
  mk->add_option("dir", dir)->required();
  mk->add_option("model", model)->required();
  auto* iso = app.add_subcommand("isolate", "move stage files into one directory each");
  iso->add_option("pattern", a)->required();
  iso->add_option("stages", n)->required();
  auto* per = app.add_subcommand("perturb", "answers that must fail validation");
  per->add_option("in", a)->required();
  per->add_option("out", b)->required();
  auto* sm = app.add_subcommand("same", "outputs bit-identical to the first");
  sm->add_option("files", files)->required()->expected(2, 100);
  std::string c;
  int m = 0;
  auto* ex = app.add_subcommand("extend", "prompts extended by their generated tokens, for scoring");
  ex->add_option("inputs", a)->required();
  ex->add_option("generated", b)->required();
  ex->add_option("out", c)->required();
  auto* em = app.add_subcommand("extended-match", "scoring of the extended prompts gives the generated tokens");
  em->add_option("generated", a)->required();
  em->add_option("scored", b)->required();
  auto* tk = app.add_subcommand("token", "prints generated[sequence, step] of an output");
  tk->add_option("file", a)->required();
  tk->add_option("sequence", n)->required();
  tk->add_option("step", m)->required();
  std::vector<int32_t> eos;
  auto* ec = app.add_subcommand("eos-check", "an --eos run stops each sequence at its first EOS and repeats it");
  ec->add_option("greedy", a)->required();
  ec->add_option("out", b)->required();
  ec->add_option("eos", eos)->required()->expected(1, 64);
  auto* ep = app.add_subcommand("eos-pick", "two EOS ids that end different sequences of a greedy run");
  ep->add_option("greedy", a)->required();
  auto* rm = app.add_subcommand("rows-match", "a ragged run's rows equal each prompt run alone");
  rm->add_option("ragged", a)->required();
  rm->add_option("pattern", b)->required();
  auto* tr = app.add_subcommand("check-trace", "a --trace file is whole and ordered");
  tr->add_option("trace", a)->required();
  tr->add_option("ranks", n)->required();
  tr->add_option("microbatches", m)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*mk) make(dir, model);
    if (*iso) isolate(a, n);
    if (*per) perturb(a, b);
    if (*sm) return same(files);
    if (*tr) return check_trace(a, n, m);
    if (*rm) return rows_match(a, b);
    if (*ex) extend(a, b, c);
    if (*em) return extended_match(a, b);
    if (*tk) {
      const TokenOutputs g = read_outputs(a);
      std::printf("%d\n", g.generated.at(size_t(n * g.n_new + m)));
    }
    if (*ec) return eos_check(a, b, eos);
    if (*ep) return eos_pick(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank_test_files: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
