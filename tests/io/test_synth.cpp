// h5pack synth: portable and deterministic (same seed -> same bits for any thread count, pinned
// values), seeds differ, sane scales, presets; and no output from synth, convert or split on a full disk.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/rng.h"
#include "h5pack/convert.h"
#include "h5pack/presets.h"
#include "h5pack/split.h"
#include "h5pack/synth.h"
#include "io/weight_file.h"
#include "io_test_util.h"

namespace lfm2 {
namespace {

using test::ScratchDir;

// FNV-1a over the raw stored bytes of every dataset, in file order.
uint64_t content_hash(const std::string& path) {
  WeightReader r(path);
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& spec : model_tensor_specs(r.config())) {
    std::vector<uint8_t> raw(size_t(spec.numel()) * dtype_size(r.dtype(spec.path)));
    r.read_rows_raw(spec.path, 0, spec.shape[0], raw.data());
    for (uint8_t b : raw) h = (h ^ b) * 0x100000001b3ull;
  }
  return h;
}

SynthOptions options(uint64_t seed, int threads, DType dtype = DType::BF16) {
  SynthOptions o;
  o.seed = seed;
  o.threads = threads;
  o.dtype = dtype;
  o.progress = false;
  return o;
}

TEST(CounterRng, PinnedValues) {
  // Any change to these breaks "same seed, same weights" across versions: keep them fixed.
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafull);
  const CounterRng rng(42, 7);
  const CounterRng same(42, 7), other_seed(43, 7), other_stream(42, 8);
  EXPECT_EQ(rng.bits(0), same.bits(0));
  EXPECT_NE(rng.bits(0), other_seed.bits(0));
  EXPECT_NE(rng.bits(0), other_stream.bits(0));
  // symmetric() is uniform on (-1, 1) with mean ~0 and variance ~1/3.
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double v = rng.symmetric(uint64_t(i));
    ASSERT_GT(v, -1.0);
    ASSERT_LT(v, 1.0);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0 / 3.0, 0.01);
}

TEST(Synth, SameSeedSameBitsForAnyThreadCount) {
  ScratchDir dir;
  const ModelConfig cfg = synth_preset("lfm2-tiny");
  synth_weights(cfg, dir.file("t1.h5"), options(7, 1));
  synth_weights(cfg, dir.file("t2.h5"), options(7, 2));
  synth_weights(cfg, dir.file("t5.h5"), options(7, 5));
  synth_weights(cfg, dir.file("s8.h5"), options(8, 2));
  const uint64_t h1 = content_hash(dir.file("t1.h5"));
  EXPECT_EQ(h1, content_hash(dir.file("t2.h5")));
  EXPECT_EQ(h1, content_hash(dir.file("t5.h5")));
  EXPECT_NE(h1, content_hash(dir.file("s8.h5")));
}

TEST(Synth, SameSeedSameFileBytes) {
  // No timestamps in the container: two runs write byte-identical files.
  ScratchDir dir;
  const ModelConfig cfg = synth_preset("lfm2-tiny");
  synth_weights(cfg, dir.file("a.h5"), options(7, 1));
  synth_weights(cfg, dir.file("b.h5"), options(7, 2));
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string a = bytes(dir.file("a.h5"));
  EXPECT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == bytes(dir.file("b.h5")));
}

TEST(Synth, FillIsIndependentOfSplitting) {
  // A block generated in pieces (as threads and row blocks do) equals the block in one piece.
  const ModelConfig cfg = synth_preset("lfm2-tiny");
  const TensorSpec spec = layer_tensor_specs(cfg, 0)[2];  // conv/in_proj
  const SynthInit init = synth_init(cfg, spec);
  const uint64_t n = uint64_t(spec.numel());
  std::vector<uint16_t> whole(n), parts(n);
  synth_fill(whole.data(), DType::BF16, 3, spec, init, 0, n, 1);
  synth_fill(parts.data(), DType::BF16, 3, spec, init, 0, 1000, 3);
  synth_fill(parts.data() + 1000, DType::BF16, 3, spec, init, 1000, n - 1000, 4);
  EXPECT_EQ(whole, parts);
}

TEST(Synth, PinnedFirstValues) {
  // Portability guard: these bits come from integer arithmetic and one rounding each, so every
  // machine must produce them.
  ScratchDir dir;
  const ModelConfig cfg = synth_preset("lfm2-tiny");
  synth_weights(cfg, dir.file("w.h5"), options(0, 2, DType::F32));
  WeightReader r(dir.file("w.h5"));
  float emb[4];
  r.read_rows_raw("embed_tokens", 0, 1, std::vector<float>(64).data());
  std::vector<float> row(64);
  r.read_rows_raw("embed_tokens", 0, 1, row.data());
  std::copy(row.begin(), row.begin() + 4, emb);
  const TensorSpec spec = embed_spec(cfg);
  std::vector<float> want(4);
  synth_fill(want.data(), DType::F32, 0, spec, synth_init(cfg, spec), 0, 4, 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(float_to_bits(emb[i]), float_to_bits(want[i]));
  // The generator's definition, written out: offset + units * float(scale / 2^24).
  const CounterRng rng(0, fnv1a64("embed_tokens"));
  const double v = double(rng.symmetric_units(0)) * double(float(std::sqrt(3.0) / 16777216.0));
  EXPECT_EQ(float_to_bits(emb[0]), float_to_bits(float(v)));
}

TEST(Synth, ScalesAreSane) {
  ScratchDir dir;
  const ModelConfig cfg = synth_preset("lfm2-mini");
  synth_weights(cfg, dir.file("w.h5"), options(1, 2, DType::F32));
  WeightReader r(dir.file("w.h5"));
  auto stdev = [](const std::vector<float>& v, double* mean = nullptr) {
    double s = 0, q = 0;
    for (float x : v) s += x;
    const double m = s / double(v.size());
    for (float x : v) q += (x - m) * (x - m);
    if (mean) *mean = m;
    return std::sqrt(q / double(v.size()));
  };
  EXPECT_NEAR(stdev(r.read_f32(embed_spec(cfg))), 1.0, 0.01);
  const auto specs = layer_tensor_specs(cfg, 3);  // MoE conv layer
  for (const auto& spec : specs) {
    double mean = 0;
    const double sd = stdev(r.read_f32(spec), &mean);
    if (spec.path.find("norm") != std::string::npos) {
      EXPECT_NEAR(mean, 1.0, 0.02) << spec.path;
      EXPECT_NEAR(sd, 0.1 / std::sqrt(3.0), 0.01) << spec.path;
    } else if (spec.path.find("expert_bias") != std::string::npos) {
      EXPECT_LT(sd, 0.05) << spec.path;
    } else {
      const double want = 1.0 / std::sqrt(double(spec.shape.back()));
      EXPECT_NEAR(sd / want, 1.0, 0.05) << spec.path;
      EXPECT_NEAR(mean, 0.0, 0.1 * want) << spec.path;
    }
  }
}

TEST(Synth, Presets) {
  const ModelConfig full = synth_preset("lfm2-8b-a1b");
  EXPECT_EQ(full.total_params(), 8339930560);  // "8.34 B"
  EXPECT_EQ(full.hidden_size, 2048);
  EXPECT_EQ(full.vocab_size, 65536);
  std::vector<int> attn;
  for (int il = 0; il < full.num_hidden_layers; ++il)
    if (full.is_attention(il)) attn.push_back(il);
  EXPECT_EQ(attn, (std::vector<int>{2, 6, 10, 14, 18, 21}));
  const ModelConfig mini = synth_preset("lfm2-mini");
  EXPECT_EQ(mini.layer_types, full.layer_types);
  EXPECT_EQ(mini.num_experts, 16);
  EXPECT_EQ(mini.num_experts_per_tok, 4);
  const ModelConfig tiny = synth_preset("lfm2-tiny");
  bool conv = false, attention = false, dense = false, moe = false;
  for (int il = 0; il < tiny.num_hidden_layers; ++il) {
    (tiny.is_attention(il) ? attention : conv) = true;
    (tiny.is_moe(il) ? moe : dense) = true;
  }
  EXPECT_TRUE(conv && attention && dense && moe);
  try {
    synth_preset("lfm2-huge");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown preset 'lfm2-huge'"), std::string::npos);
  }
}

// Runs `f` in a forked child whose files may not grow beyond 256 KiB (a stand-in for a full disk:
// writes fail with EFBIG); returns the child's exit code: 3 when `f` threw lfm2::Error.
template <typename F>
int exit_code_with_full_disk(F f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {256 << 10, 256 << 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      f();
    } catch (const Error&) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(FullDisk, SynthLeavesNoOutput) {
  ScratchDir dir;
  EXPECT_EQ(exit_code_with_full_disk([&] { synth_weights(synth_preset("lfm2-mini"), dir.file("w.h5"), options(1, 1)); }),
            3);
  EXPECT_TRUE(dir.entries().empty());  // neither the output nor its temporary
}

TEST(FullDisk, ConvertAndSplitLeaveNoOutput) {
  ScratchDir dir;
  const ModelConfig cfg = synth_preset("lfm2-mini");  // 87 MB in bf16
  synth_weights(cfg, dir.file("model.h5"), options(1, 2));
  test::CheckpointOptions opt;
  test::write_checkpoint(dir.file("ckpt"), test::small_config(), opt);
  EXPECT_EQ(exit_code_with_full_disk([&] { convert_checkpoint(dir.file("ckpt"), dir.file("c.h5"), DType::F32); }), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("c.h5")));  // small enough: the limit itself is not the failure
  EXPECT_EQ(exit_code_with_full_disk([&] { split_weights(dir.file("model.h5"), 4, dir.file("s%d.h5")); }), 3);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"c.h5", "ckpt", "model.h5"}));
  test::write_checkpoint(dir.file("big"), synth_preset("lfm2-mini"), opt);
  EXPECT_EQ(exit_code_with_full_disk([&] { convert_checkpoint(dir.file("big"), dir.file("b.h5"), DType::F32); }), 3);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"big", "c.h5", "ckpt", "model.h5"}));
}

}  // namespace
}  // namespace lfm2
