// FP8 weights: the e4m3 codec (OCP E4M3FN: RNE, saturating at 448, NaN 0x7f), the quantizer's
// round trip, `h5pack quantize` (both schemes, experts or every projection), the scales in split /
// verify / load, a file with bad scales refused naming the dataset, and the conversion of a
// published-style FP8 checkpoint (F8_E4M3 weights + F32 weight_scale_inv, 128 x 128 blocks), and
// `convert --dtype fp8` (the bits of convert + quantize, no temporary left).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/fp8.h"
#include "common/rng.h"
#include "h5pack/convert.h"
#include "h5pack/convert_fp8.h"
#include "h5pack/presets.h"
#include "h5pack/quantize.h"
#include "h5pack/split.h"
#include "h5pack/synth.h"
#include "h5pack/verify.h"
#include "io/weight_file.h"
#include "io_test_util.h"
#include "model/layer_weights.h"

namespace lfm2 {
namespace {

using test::ScratchDir;

// e4m3 by its definition: every finite code decoded, the nearest (ties to the even code) chosen.
uint8_t nearest_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const float a = std::fabs(x);
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const float d = std::fabs(e4m3_to_float(uint8_t(c)) - a), db = std::fabs(e4m3_to_float(uint8_t(best)) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  if (a >= kE4m3Max) best = 0x7e;  // saturating
  return uint8_t(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(Fp8Codec, DecodesTheSpecsValues) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent 15 holds numbers in E4M3FN
}

TEST(Fp8Codec, EveryCodeRoundTripsAndMidpointsRoundToEven) {
  for (int c = 0; c < 256; ++c) {
    if (e4m3_is_nan(uint8_t(c))) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(uint8_t(c))), uint8_t(c)) << c;
  }
  for (int c = 0; c < 0x7e; ++c) {  // the midpoint between c and c + 1 goes to the even one
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1)), mid = 0.5f * (lo + hi);
    EXPECT_EQ(float_to_e4m3(mid), uint8_t((c & 1) ? c + 1 : c)) << c;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.0f)), uint8_t(c)) << c;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 1e9f)), uint8_t(c + 1)) << c;
    EXPECT_EQ(float_to_e4m3(-mid), uint8_t(0x80 | ((c & 1) ? c + 1 : c))) << c;
  }
}

TEST(Fp8Codec, SaturatesAndKeepsNan) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(460.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(NAN)));
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

TEST(Fp8Codec, MatchesTheNearestCodeOnRandomValues) {
  const CounterRng rng(7, 1);
  for (uint64_t i = 0; i < 20000; ++i) {
    const float x = float(rng.symmetric(i) * std::ldexp(1.0, int(i % 24) - 12));
    ASSERT_EQ(float_to_e4m3(x), nearest_e4m3(x)) << x;
  }
}

// The quantizer: scales = amax / 448 per row or block, every element within half a step of its
// e4m3 grid (2^-4 relative for normals, 2^-10 * scale absolute below the normal range).
void expect_round_trip(int64_t rows, int64_t cols, Fp8Scheme s) {
  std::vector<float> w(size_t(rows * cols)), back(w.size());
  const CounterRng rng(3, uint64_t(rows * 1000 + cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(rng.symmetric(i) * (1.0 + double(i % 17)));
  std::vector<uint8_t> q(w.size());
  std::vector<float> scale(size_t(fp8_scale_rows(s, rows) * fp8_scale_cols(s, cols)));
  fp8_quantize(q.data(), scale.data(), w.data(), rows, cols, s);
  fp8_dequantize(back.data(), q.data(), scale.data(), rows, cols, s);
  const int64_t tr = s == Fp8Scheme::Channel ? 1 : 128, tc = s == Fp8Scheme::Channel ? cols : 128;
  const int64_t sc = fp8_scale_cols(s, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float sv = scale[size_t((r / tr) * sc + c / tc)], x = w[size_t(r * cols + c)];
      const float tol = std::max(std::fabs(x) * 0x1p-4f, sv * 0x1p-10f) * 1.0001f;
      ASSERT_LE(std::fabs(back[size_t(r * cols + c)] - x), tol) << r << "," << c;
    }
  for (int64_t i = 0; i < int64_t(scale.size()); ++i) {  // the block's amax lands on 448 exactly
    const int64_t r0 = (i / sc) * tr, c0 = (i % sc) * tc;
    float amax = 0;
    for (int64_t r = r0; r < std::min(rows, r0 + tr); ++r)
      for (int64_t c = c0; c < std::min(cols, c0 + tc); ++c) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
    EXPECT_EQ(scale[size_t(i)], amax / 448.0f);
  }
}

TEST(Fp8Quantize, RoundTripBothSchemesAndRaggedBlocks) {
  for (auto s : {Fp8Scheme::Channel, Fp8Scheme::Block128}) {
    expect_round_trip(1, 1, s);
    expect_round_trip(7, 33, s);
    expect_round_trip(300, 200, s);  // 3 x 2 blocks, the last ones cut
    expect_round_trip(256, 128, s);
  }
}

TEST(Fp8Quantize, ZeroRowsGetScaleOneAndActivationsKeepZeros) {
  std::vector<float> w(16, 0.0f), scale(2);
  std::vector<uint8_t> q(16);
  fp8_quantize(q.data(), scale.data(), w.data(), 2, 8, Fp8Scheme::Channel);
  EXPECT_EQ(scale[0], 1.0f);
  EXPECT_EQ(q[3], 0);
  std::vector<float> x = {0, 0, 0, 0, 1.0f, -3.0f, 0.3f, 1e-3f};
  fp8_fake_quantize_rows(x.data(), 2, 4, 4);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[5], -3.0f);  // the amax is exact
  const float s = 3.0f / 448.0f;
  EXPECT_EQ(x[6], e4m3_to_float(float_to_e4m3(0.3f / s)) * s);
}

// ---- files

std::string synth_tiny(const ScratchDir& dir) {
  SynthOptions opt;
  opt.seed = 5;
  opt.progress = false;
  synth_weights(synth_preset("lfm2-tiny"), dir.file("bf16.h5"), opt);
  return dir.file("bf16.h5");
}

struct QuantCase {
  Fp8Scheme scheme;
  bool projections;
};

class QuantizeFiles : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QuantizeFiles, WritesE4m3AndScalesThatSplitVerifyAndLoad) {
  ScratchDir dir;
  const std::string in = synth_tiny(dir), out = dir.file("fp8.h5");
  QuantizeOptions opt;
  opt.scheme = GetParam().scheme;
  opt.projections = GetParam().projections;
  quantize_weights(in, out, opt);
  WeightReader src(in), r(out);
  const ModelConfig& cfg = r.config();
  ASSERT_TRUE(cfg.fp8.on);
  EXPECT_EQ(cfg.fp8.scheme, opt.scheme);
  EXPECT_EQ(cfg.fp8.projections, opt.projections);
  EXPECT_EQ(r.weight_dtype(), DType::BF16);
  int quantized = 0;
  for (const auto& spec : model_tensor_specs(cfg)) {
    if (is_fp8_scale_leaf(spec.path)) continue;
    const bool fp8 = spec.dtype == DType::E4M3;
    quantized += fp8;
    const bool expert = spec.path.find("/experts/") != std::string::npos;
    const bool proj = spec.path.find("proj") != std::string::npos ||
                      (spec.path.find("feed_forward/w") != std::string::npos && !expert);
    EXPECT_EQ(fp8, expert || (opt.projections && proj)) << spec.path;
    EXPECT_EQ(r.dtype(spec.path), stored_dtype(spec, DType::BF16)) << spec.path;
    if (!fp8) {  // copied bit for bit
      EXPECT_EQ(r.expected_digest(spec.path), src.expected_digest(spec.path)) << spec.path;
      continue;
    }
    const TensorSpec ss = fp8_scale_spec(spec, opt.scheme);
    ASSERT_EQ(r.shape(ss.path), ss.shape);
    EXPECT_EQ(r.dtype(ss.path), DType::F32);
    // q and scale are exactly fp8_quantize of the bf16 values, matrix by matrix.
    const std::vector<float> w = src.read_f32(spec), s = r.read_f32(ss);
    std::vector<uint8_t> q(size_t(spec.numel())), want_q(q.size());
    std::vector<float> want_s(s.size());
    r.read_rows_raw(spec.path, 0, spec.shape[0], q.data());
    const size_t nd = spec.shape.size();
    const int64_t rows = spec.shape[nd - 2], cols = spec.shape[nd - 1], n_mat = spec.numel() / (rows * cols);
    for (int64_t b = 0; b < n_mat; ++b)
      fp8_quantize(want_q.data() + b * rows * cols, want_s.data() + b * (ss.numel() / n_mat),
                   w.data() + b * rows * cols, rows, cols, opt.scheme);
    EXPECT_EQ(q, want_q) << spec.path;
    EXPECT_EQ(s, want_s) << spec.path;
  }
  EXPECT_EQ(quantized, opt.projections ? 4 * 3 + 2 * 4 + 4 * 2 + 2 * 3 : 4 * 3);  // tiny: 6 layers, 2 attention, 2 dense
  EXPECT_EQ(verify_weights(out, false).tensors, int64_t(model_tensor_specs(cfg).size()));

  // Loaded for the CPU stage: each matrix dequantized, w = q * scale.
  const ModelWeights m = load_model_weights(r, whole_model(int(cfg.num_hidden_layers)));
  const LayerWeights& l5 = m.layer(5);
  TensorSpec w1;
  for (const auto& spec : layer_tensor_specs(cfg, 5))
    if (spec.path == layer_path(5, names::kExpertsW1)) w1 = spec;
  std::vector<uint8_t> q(size_t(w1.numel()));
  r.read_rows_raw(w1.path, 0, w1.shape[0], q.data());
  const std::vector<float> s = r.read_f32(fp8_scale_spec(w1, opt.scheme));
  std::vector<float> want(q.size());
  const int64_t per = w1.shape[1] * w1.shape[2], per_s = int64_t(s.size()) / w1.shape[0];
  for (int64_t e = 0; e < w1.shape[0]; ++e)
    fp8_dequantize(want.data() + e * per, q.data() + e * per, s.data() + e * per_s, w1.shape[1], w1.shape[2],
                   opt.scheme);
  EXPECT_EQ(l5.experts_w1, want);

  // Split: each stage file carries its matrices' scales and verifies alone.
  const auto outs = split_weights(out, 3, dir.file("st-%d.h5"));
  for (const auto& p : outs) {
    WeightReader st(p);
    EXPECT_TRUE(st.config().fp8.on);
    for (const auto& spec : stage_tensor_specs(st.config(), st.stage())) EXPECT_TRUE(st.has(spec.path)) << spec.path;
    EXPECT_NO_THROW(verify_weights(p, false));
    EXPECT_EQ(st.identity()->fingerprint, r.identity()->fingerprint);
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8, QuantizeFiles,
                         ::testing::Values(QuantCase{Fp8Scheme::Channel, false}, QuantCase{Fp8Scheme::Block128, false},
                                           QuantCase{Fp8Scheme::Channel, true}, QuantCase{Fp8Scheme::Block128, true}));

TEST(QuantizeFiles, RefusesFp8AndStageInputsLeavingNoOutput) {
  ScratchDir dir;
  const std::string in = synth_tiny(dir);
  quantize_weights(in, dir.file("a.h5"), {});
  EXPECT_THROW(quantize_weights(dir.file("a.h5"), dir.file("b.h5"), {}), Error);
  split_weights(in, 2, dir.file("s-%d.h5"));
  EXPECT_THROW(quantize_weights(dir.file("s-0.h5"), dir.file("b.h5"), {}), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("b.h5")));
}

// A file whose scales were written wrong (with digests that match them): verify and the loader
// refuse it in one line naming the dataset.
std::string write_with_scale(const ScratchDir& dir, const std::string& name, float bad, bool wrong_shape) {
  ModelConfig cfg = synth_preset("lfm2-tiny");
  cfg.fp8.on = true;
  const std::string path = dir.file(name);
  WeightWriter w(path, cfg, DType::BF16);
  bool done = false;
  for (TensorSpec spec : model_tensor_specs(cfg)) {
    const bool target = !done && is_fp8_scale_leaf(spec.path) && spec.layer == 3;
    if (target && wrong_shape) spec.shape.back() += 1;
    std::vector<float> v(size_t(spec.numel()), is_fp8_scale_leaf(spec.path) ? 0.01f : 0.5f);
    if (target && !wrong_shape) v[3] = bad;
    done = done || target;
    w.create(spec);
    if (spec.dtype == DType::E4M3) {
      std::vector<uint8_t> q(v.size(), float_to_e4m3(0.5f));
      w.write_rows(spec, 0, spec.shape[0], q.data(), DType::E4M3);
    } else {
      w.write_rows(spec, 0, spec.shape[0], v.data(), DType::F32);
    }
  }
  w.commit();
  return path;
}

void expect_refused(const std::string& path, const std::string& what) {
  try {
    verify_weights(path, false);
    ADD_FAILURE() << "verify accepted " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  try {
    WeightReader r(path);
    load_model_weights(r, whole_model(int(r.config().num_hidden_layers)));
    ADD_FAILURE() << "load accepted " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Fp8Scales, BadScalesAreRefusedNamingTheDataset) {
  ScratchDir dir;
  const std::string ds = "layers/3/feed_forward/experts/w1_scale";
  expect_refused(write_with_scale(dir, "zero.h5", 0.0f, false), ds + "': scale [3] = 0");
  expect_refused(write_with_scale(dir, "neg.h5", -1.0f, false), ds + "': scale [3] = -1");
  expect_refused(write_with_scale(dir, "nan.h5", NAN, false), ds + "': scale [3] = nan");
  expect_refused(write_with_scale(dir, "inf.h5", INFINITY, false), ds + "': scale [3] = inf");
  expect_refused(write_with_scale(dir, "shape.h5", 1.0f, true), ds + "'");
  EXPECT_NO_THROW(verify_weights(write_with_scale(dir, "good.h5", 0.5f, false), false));
}

TEST(Fp8Config, RoundTripsAndRefusesWhatItCannotRun) {
  ModelConfig c = synth_preset("lfm2-tiny");
  c.fp8 = {true, Fp8Scheme::Block128, true};
  const ModelConfig back = ModelConfig::from_json_text(c.to_json_text(), "t");
  EXPECT_TRUE(back.fp8.on);
  EXPECT_EQ(back.fp8.scheme, Fp8Scheme::Block128);
  EXPECT_TRUE(back.fp8.projections);
  auto with = [&](const std::string& q) {
    nlohmann::json j = synth_preset("lfm2-tiny").to_json();
    j["quantization_config"] = nlohmann::json::parse(q);
    return j.dump();
  };
  // HF's published keys: 128 x 128 blocks, every projection.
  const ModelConfig hf =
      ModelConfig::from_json_text(with(R"({"quant_method":"fp8","activation_scheme":"dynamic","weight_block_size":[128,128]})"), "t");
  EXPECT_EQ(hf.fp8.scheme, Fp8Scheme::Block128);
  EXPECT_TRUE(hf.fp8.projections);
  for (const char* bad : {R"({"quant_method":"awq"})", R"({"quant_method":"fp8","activation_scheme":"static"})",
                          R"({"quant_method":"fp8","weight_block_size":[64,64]})", R"({"quant_method":"fp8","fmt":"e5m2"})",
                          R"({"quant_method":"fp8","lfm2_scheme":"block128"})"})
    EXPECT_THROW(ModelConfig::from_json_text(with(bad), "t"), Error) << bad;
}

// ---- convert: a published-style FP8 checkpoint (DeepSeek-V3 / Qwen3-FP8 layout).

// The checkpoint's tensors with every projection (or only the experts) as F8_E4M3 + F32
// weight_scale_inv of 128 x 128 blocks.
std::vector<test::StTensor> fp8_checkpoint(const ModelConfig& cfg, bool experts_only) {
  test::CheckpointOptions opt;
  opt.dtype = DType::F32;
  std::vector<test::StTensor> out;
  for (auto& t : test::checkpoint_tensors(cfg, opt)) {
    const std::string& n = t.name;
    const bool expert = n.find(".experts.") != std::string::npos;
    const bool proj = n.find("_proj.weight") != std::string::npos ||
                      (n.find("feed_forward.w") != std::string::npos && !expert);
    if (!(expert || (!experts_only && proj))) {
      t.dtype = DType::BF16;
      convert_elements(t.values.data(), DType::F32, test::to_bytes(t.values, DType::BF16).data(), DType::BF16,
                       t.values.size());
      out.push_back(t);
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<uint8_t> q(t.values.size());
    test::StTensor s{n + "_scale_inv", DType::F32, {fp8_scale_rows(Fp8Scheme::Block128, rows),
                                                    fp8_scale_cols(Fp8Scheme::Block128, cols)}, {}};
    s.values.resize(size_t(s.shape[0] * s.shape[1]));
    fp8_quantize(q.data(), s.values.data(), t.values.data(), rows, cols, Fp8Scheme::Block128);
    for (size_t i = 0; i < q.size(); ++i) t.values[i] = e4m3_to_float(q[i]);
    t.dtype = DType::E4M3;
    out.push_back(t);
    out.push_back(s);
  }
  return out;
}

void write_fp8_checkpoint(const std::string& dir, ModelConfig cfg, const std::vector<test::StTensor>& tensors,
                          bool with_quant_config) {
  test::write_checkpoint_tensors(dir, cfg, tensors);
  nlohmann::json j = cfg.to_json();
  if (with_quant_config)
    j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                {"weight_block_size", {128, 128}}};
  std::ofstream(dir + "/config.json") << j.dump(2);
}

TEST(Fp8Convert, PublishedCheckpointConvertsDirectly) {
  for (bool experts_only : {false, true}) {
    ScratchDir dir;
    ModelConfig cfg = test::small_config();
    cfg.hidden_size = 160;  // 2 blocks of 128 along H, the second cut
    cfg.validate("t");
    const auto tensors = fp8_checkpoint(cfg, experts_only);
    write_fp8_checkpoint(dir.file("ck"), cfg, tensors, true);
    convert_checkpoint(dir.file("ck"), dir.file("out.h5"), std::nullopt, false);
    WeightReader r(dir.file("out.h5"));
    ASSERT_TRUE(r.config().fp8.on);
    EXPECT_EQ(r.config().fp8.scheme, Fp8Scheme::Block128);
    EXPECT_EQ(r.config().fp8.projections, !experts_only);
    EXPECT_EQ(r.weight_dtype(), DType::BF16);
    EXPECT_NO_THROW(verify_weights(dir.file("out.h5"), false));
    // A projection and an expert's matrix: the e4m3 bytes and scales as published.
    std::map<std::string, test::StTensor> by;
    for (const auto& t : tensors) by[t.name] = t;
    const std::string leaf = experts_only ? "feed_forward/experts/w2" : "conv/in_proj";
    const std::string hf = experts_only ? "model.layers.3.feed_forward.experts.1.w2.weight"
                                        : "model.layers.2.conv.in_proj.weight";
    const std::string path = layer_path(experts_only ? 3 : 2, leaf);
    const auto shape = r.shape(path);
    const int64_t per = shape[shape.size() - 2] * shape.back(), off = experts_only ? per : 0;
    std::vector<uint8_t> q(size_t(off + per));
    r.read_rows_raw(path, 0, experts_only ? 2 : shape[0], q.data());
    for (int64_t i = 0; i < per; ++i) ASSERT_EQ(e4m3_to_float(q[size_t(off + i)]), by[hf].values[size_t(i)]) << i;
    const std::vector<float> s = r.read_f32({path + "_scale", r.shape(path + "_scale"), -1, "", DType::F32});
    const auto& want_s = by[hf + "_scale_inv"].values;
    EXPECT_TRUE(std::equal(want_s.begin(), want_s.end(), s.begin() + (experts_only ? int64_t(want_s.size()) : 0)));
  }
}

TEST(Fp8Convert, RefusesE4m3WithoutConfigBadScalesAndMissingScales) {
  ModelConfig cfg = test::small_config();
  {
    ScratchDir dir;
    write_fp8_checkpoint(dir.file("ck"), cfg, fp8_checkpoint(cfg, false), false);
    EXPECT_THROW(convert_checkpoint(dir.file("ck"), dir.file("o.h5"), std::nullopt, false), Error);
    EXPECT_FALSE(std::filesystem::exists(dir.file("o.h5")));
  }
  {
    ScratchDir dir;
    auto t = fp8_checkpoint(cfg, false);
    for (auto& x : t)
      if (x.name == "model.layers.1.self_attn.k_proj.weight_scale_inv") x.values[0] = 0.0f;
    write_fp8_checkpoint(dir.file("ck"), cfg, t, true);
    try {
      convert_checkpoint(dir.file("ck"), dir.file("o.h5"), std::nullopt, false);
      ADD_FAILURE() << "a zero scale was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("k_proj.weight_scale_inv': scale [0] = 0"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("o.h5")));
  }
  {
    ScratchDir dir;
    auto t = fp8_checkpoint(cfg, false);
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const test::StTensor& x) { return x.name == "model.layers.3.feed_forward.experts.2.w3.weight_scale_inv"; }),
            t.end());
    write_fp8_checkpoint(dir.file("ck"), cfg, t, true);
    EXPECT_THROW(convert_checkpoint(dir.file("ck"), dir.file("o.h5"), std::nullopt, false), Error);
  }
}

// `convert --dtype fp8`: every dataset's digest and the config equal those of `convert` then
// `quantize`, for both schemes, experts only or every projection; nothing but OUT is left.
TEST(Fp8Convert, DtypeFp8IsConvertThenQuantize) {
  for (const QuantCase c : {QuantCase{Fp8Scheme::Channel, false}, QuantCase{Fp8Scheme::Block128, true}}) {
    ScratchDir dir;
    const ModelConfig cfg = test::small_config();
    test::write_checkpoint(dir.file("ck"), cfg, {});
    QuantizeOptions opt;
    opt.scheme = c.scheme;
    opt.projections = c.projections;
    convert_checkpoint(dir.file("ck"), dir.file("bf16.h5"), std::nullopt, false);
    quantize_weights(dir.file("bf16.h5"), dir.file("want.h5"), opt);
    convert_checkpoint_fp8(dir.file("ck"), dir.file("out.h5"), opt, true);
    EXPECT_EQ(dir.entries(), (std::vector<std::string>{"bf16.h5", "ck", "out.h5", "want.h5"}));
    WeightReader got(dir.file("out.h5")), want(dir.file("want.h5"));
    EXPECT_EQ(got.config().to_json_text(), want.config().to_json_text());
    EXPECT_EQ(got.identity()->fingerprint, want.identity()->fingerprint);
    for (const auto& spec : model_tensor_specs(got.config()))
      EXPECT_EQ(got.expected_digest(spec.path), want.expected_digest(spec.path)) << spec.path;
  }
}

TEST(Fp8Convert, DtypeFp8RefusesLeavingNothingBehind) {
  const ModelConfig cfg = test::small_config();
  {  // a broken checkpoint: the first pass fails; neither OUT nor the temporary is left
    ScratchDir dir;
    auto t = test::checkpoint_tensors(cfg, {});
    t.pop_back();
    test::write_checkpoint_tensors(dir.file("ck"), cfg, t, 1);
    EXPECT_THROW(convert_checkpoint_fp8(dir.file("ck"), dir.file("o.h5"), {}, false), Error);
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"ck"});
  }
  {  // an FP8 checkpoint: converted as it is, but not re-quantized to another scheme
    ScratchDir dir;
    write_fp8_checkpoint(dir.file("ck"), cfg, fp8_checkpoint(cfg, true), true);
    try {
      convert_checkpoint_fp8(dir.file("ck"), dir.file("o.h5"), {}, true);
      ADD_FAILURE() << "--scheme was accepted for an FP8 checkpoint";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FP8 already"), std::string::npos) << e.what();
    }
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"ck"});
    convert_checkpoint_fp8(dir.file("ck"), dir.file("o.h5"), {}, false);
    EXPECT_EQ(WeightReader(dir.file("o.h5")).config().fp8.scheme, Fp8Scheme::Block128);
  }
}

}  // namespace
}  // namespace lfm2
