// h5pack convert: bit-identical tensors for every source x stored dtype, both expert spellings,
// tied and untied heads, shards; and every bad checkpoint with no output left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "h5pack/convert.h"
#include "io/weight_file.h"
#include "io_test_util.h"

namespace lfm2 {
namespace {

using test::CheckpointOptions;
using test::ScratchDir;

std::string expert_name(const std::string& hf, int64_t e) {
  std::string s = hf;
  s.replace(s.find("{e}"), 3, std::to_string(e));
  return s;
}

// Every dataset of `out` holds exactly the source values, converted to its stored dtype.
void expect_matches(const std::string& out, const ModelConfig& cfg, const std::map<std::string, test::StTensor>& src,
                    DType stored_matrix) {
  WeightReader r(out);
  EXPECT_EQ(r.weight_dtype(), stored_matrix);
  const auto specs = model_tensor_specs(cfg);
  EXPECT_EQ(test::list_datasets(out).size(), specs.size());
  for (const auto& spec : specs) {
    const DType stored = spec.is_vector() ? DType::F32 : stored_matrix;
    ASSERT_EQ(r.dtype(spec.path), stored) << spec.path;
    // The source values in dataset order (experts stacked along the first dimension).
    std::vector<float> want;
    if (spec.hf_name.find("{e}") == std::string::npos) {
      want = src.at(spec.hf_name).values;
    } else {
      for (int64_t e = 0; e < spec.shape[0]; ++e) {
        const auto& v = src.at(expert_name(spec.hf_name, e)).values;
        want.insert(want.end(), v.begin(), v.end());
      }
    }
    ASSERT_EQ(int64_t(want.size()), spec.numel()) << spec.path;
    std::vector<uint8_t> want_bytes(want.size() * dtype_size(stored)), got(want_bytes.size());
    convert_elements(want_bytes.data(), stored, want.data(), DType::F32, want.size());
    r.read_rows_raw(spec.path, 0, spec.shape[0], got.data());
    ASSERT_EQ(got, want_bytes) << spec.path;
  }
}

using Combo = std::tuple<DType, DType, bool, bool>;  // source, stored, fused, tied
class ConvertCombos : public ::testing::TestWithParam<Combo> {};

TEST_P(ConvertCombos, BitIdentical) {
  const auto [source, stored, fused, tied] = GetParam();
  ScratchDir dir;
  const ModelConfig cfg = test::small_config(tied);
  CheckpointOptions opt;
  opt.dtype = source;
  opt.fused_experts = fused;
  const auto src = test::write_checkpoint(dir.file("ckpt"), cfg, opt);
  EXPECT_EQ(src.count("lm_head.weight"), tied ? 0u : 1u);
  convert_checkpoint(dir.file("ckpt"), dir.file("out.h5"), stored);
  expect_matches(dir.file("out.h5"), cfg, src, stored);
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, ConvertCombos,
    ::testing::Combine(::testing::Values(DType::BF16, DType::F16, DType::F32),
                       ::testing::Values(DType::BF16, DType::F16, DType::F32), ::testing::Bool(), ::testing::Bool()),
    [](const auto& info) {
      return std::string("from_") + dtype_name(std::get<0>(info.param)) + "_to_" + dtype_name(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_fused" : "_per_expert") + (std::get<3>(info.param) ? "_tied" : "_untied");
    });

TEST(Convert, DefaultDtypeIsTheCheckpointsAndShardsWork) {
  ScratchDir dir;
  const ModelConfig cfg = test::small_config();
  CheckpointOptions opt;
  opt.dtype = DType::F16;
  opt.shards = 3;
  const auto src = test::write_checkpoint(dir.file("ckpt"), cfg, opt);
  convert_checkpoint(dir.file("ckpt"), dir.file("out.h5"), std::nullopt);
  expect_matches(dir.file("out.h5"), cfg, src, DType::F16);
  EXPECT_EQ(WeightReader(dir.file("out.h5")).config().to_json_text(), cfg.to_json_text());
}

// A broken checkpoint: the error names the file and the tensor, and no output (nor temporary) is left.
class ConvertErrors : public ::testing::Test {
 protected:
  void expect_fails(const std::vector<std::string>& parts) {
    try {
      convert_checkpoint(dir_.file("ckpt"), dir_.file("out.h5"), std::nullopt);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos);
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
    EXPECT_EQ(dir_.entries(), std::vector<std::string>{"ckpt"});
  }
  std::vector<test::StTensor> tensors(bool fused = false) {
    CheckpointOptions opt;
    opt.fused_experts = fused;
    return test::checkpoint_tensors(cfg_, opt);
  }
  void write(const std::vector<test::StTensor>& t, int shards = 1) {
    test::write_checkpoint_tensors(dir_.file("ckpt"), cfg_, t, shards);
  }
  static void erase(std::vector<test::StTensor>& t, const std::string& name) {
    auto it = std::find_if(t.begin(), t.end(), [&](const auto& x) { return x.name == name; });
    ASSERT_NE(it, t.end()) << name;
    t.erase(it);
  }
  static test::StTensor& find(std::vector<test::StTensor>& t, const std::string& name) {
    return *std::find_if(t.begin(), t.end(), [&](const auto& x) { return x.name == name; });
  }

  ScratchDir dir_;
  ModelConfig cfg_ = test::small_config();
};

TEST_F(ConvertErrors, MissingTensor) {
  auto t = tensors();
  erase(t, "model.layers.3.feed_forward.experts.2.w3.weight");
  write(t);
  expect_fails({"ckpt", "model.layers.3.feed_forward.experts.2.w3.weight", "missing"});
}

TEST_F(ConvertErrors, MissingFusedTensor) {
  auto t = tensors(true);
  erase(t, "model.layers.2.feed_forward.experts.down_proj");
  write(t);
  expect_fails({"ckpt", "model.layers.2.feed_forward.experts.", "missing"});
}

TEST_F(ConvertErrors, DuplicatedAcrossShards) {
  auto t = tensors();
  t.push_back(t[5]);  // lands in another shard than the first copy
  write(t, 2);
  expect_fails({"model-0000", t[5].name, "duplicated"});
}

TEST_F(ConvertErrors, WrongShape) {
  auto t = tensors();
  auto& q = find(t, "model.layers.1.self_attn.q_proj.weight");
  q.shape = {16, 64};
  write(t);
  expect_fails({"model.safetensors", "model.layers.1.self_attn.q_proj.weight", "[16, 64]", "[32, 32]"});
}

TEST_F(ConvertErrors, WrongDtype) {
  auto t = tensors();
  write(t);
  // Rewrite with one tensor declared I32 (same byte count as its F32 bytes would be: 4 per element).
  std::ifstream in(dir_.file("ckpt/model.safetensors"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string all(bytes.begin(), bytes.end());
  const std::string key = "\"model.embedding_norm.weight\":{\"data_offsets\":";
  const size_t p = all.find(key);
  ASSERT_NE(p, std::string::npos);
  const size_t d = all.find("\"dtype\":\"BF16\"", p);
  all.replace(d, 14, "\"dtype\":\"I16\" ");  // same length keeps every offset
  std::ofstream(dir_.file("ckpt/model.safetensors"), std::ios::binary) << all;
  expect_fails({"model.safetensors", "model.embedding_norm.weight", "unsupported dtype I16"});
}

TEST_F(ConvertErrors, UnexpectedTensor) {
  auto t = tensors();
  t.push_back({"model.layers.0.self_attn.rotary.inv_freq", DType::F32, {4}, {1, 2, 3, 4}});
  write(t);
  expect_fails({"model.safetensors", "model.layers.0.self_attn.rotary.inv_freq", "not part of the model"});
}

TEST_F(ConvertErrors, HeadPresentWithTiedConfig) {
  auto t = tensors();
  t.push_back({"lm_head.weight", DType::BF16, {96, 32}, std::vector<float>(96 * 32, 0.5f)});
  write(t);
  expect_fails({"model.safetensors", "lm_head.weight", "tie_word_embeddings"});
}

TEST_F(ConvertErrors, HeadMissingWithUntiedConfig) {
  cfg_.tie_word_embeddings = false;
  auto t = tensors();
  erase(t, "lm_head.weight");
  write(t);
  expect_fails({"ckpt", "lm_head.weight", "missing"});
}

TEST_F(ConvertErrors, ConfigContradictsTensors) {
  write(tensors());
  ModelConfig wrong = cfg_;
  wrong.hidden_size = 64;  // the checkpoint is H 32
  std::ofstream(dir_.file("ckpt/config.json")) << wrong.to_json_text();
  expect_fails({"model.embed_tokens.weight", "[96, 32]", "config.json implies [96, 64]"});
}

TEST_F(ConvertErrors, ConfigHasFewerExperts) {
  write(tensors());
  ModelConfig wrong = cfg_;
  wrong.num_experts = 3;
  std::ofstream(dir_.file("ckpt/config.json")) << wrong.to_json_text();
  // Layer 2's router is checked first: (4, H) in the file against (3, H) from config.json.
  expect_fails({"model.safetensors", "model.layers.2.feed_forward.gate.weight", "config.json implies [3, 32]"});
}

TEST_F(ConvertErrors, BothExpertSpellings) {
  auto t = tensors();
  auto fused = tensors(true);
  t.push_back(find(fused, "model.layers.2.feed_forward.experts.gate_up_proj"));
  write(t);
  expect_fails({"model.safetensors", "gate_up_proj", "per-expert", "both"});
}

TEST_F(ConvertErrors, MissingOrBrokenConfig) {
  write(tensors());
  std::filesystem::remove(dir_.file("ckpt/config.json"));
  expect_fails({"config.json", "missing"});
  std::ofstream(dir_.file("ckpt/config.json")) << "{\"hidden_size\": 32,";
  expect_fails({"config.json", "invalid JSON"});
}

TEST_F(ConvertErrors, CorruptSafetensors) {
  write(tensors());
  std::filesystem::resize_file(dir_.file("ckpt/model.safetensors"), 1000);
  expect_fails({"model.safetensors", "truncated"});
  std::filesystem::remove(dir_.file("ckpt/model.safetensors"));
  expect_fails({"ckpt", "no model.safetensors"});
}

}  // namespace
}  // namespace lfm2
