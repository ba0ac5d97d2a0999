// WeightWriter / WeightReader round trips for each stored dtype, and the temporary-name rule.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/weight_file.h"
#include "io_test_util.h"

namespace lfm2 {
namespace {

TensorSpec matrix_spec() { return {"layers/0/conv/in_proj", {6, 5}, 0, "x", std::nullopt}; }
TensorSpec vector_spec() { return {"layers/0/operator_norm", {5}, 0, "y", std::nullopt}; }

std::vector<float> values(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) * 0.37f - 3.3f + (i == 7 ? 1e-7f : 0.0f);
  return v;
}

class RoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTrip, StoredBitsExact) {
  test::ScratchDir dir;
  const DType stored = GetParam();
  const ModelConfig cfg = test::small_config();
  const auto m = matrix_spec(), v = vector_spec();
  const auto mv = values(30), vv = values(5);
  {
    WeightWriter w(dir.file("w.h5"), cfg, stored);
    w.create(m);
    w.write_rows(m, 0, 2, mv.data(), DType::F32);  // in two row blocks
    w.write_rows(m, 2, 4, mv.data() + 10, DType::F32);
    w.write(v, vv.data(), DType::F32);
    EXPECT_EQ(w.stored_dtype(v), DType::F32);
    w.commit();
  }
  WeightReader r(dir.file("w.h5"));
  EXPECT_EQ(r.weight_dtype(), stored);
  EXPECT_EQ(r.dtype(m.path), stored);
  EXPECT_EQ(r.dtype(v.path), DType::F32);
  EXPECT_EQ(r.shape(m.path), (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(r.config().to_json_text(), cfg.to_json_text());
  // Raw stored bits equal our own conversion of the input.
  std::vector<uint8_t> raw(30 * dtype_size(stored)), want(30 * dtype_size(stored));
  r.read_rows_raw(m.path, 0, 6, raw.data());
  convert_elements(want.data(), stored, mv.data(), DType::F32, 30);
  EXPECT_EQ(raw, want);
  // Reading as fp32 gives the stored values exactly.
  auto back = r.read_f32(m);
  std::vector<float> want_f(30);
  convert_elements(want_f.data(), DType::F32, want.data(), stored, 30);
  EXPECT_EQ(back, want_f);
  EXPECT_EQ(r.read_f32(v), vv);
  // A spec of another shape is refused.
  TensorSpec wrong = m;
  wrong.shape = {5, 6};
  EXPECT_THROW(r.read_f32(wrong), Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTrip, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(WeightWriter, NoOutputWithoutCommit) {
  test::ScratchDir dir;
  {
    WeightWriter w(dir.file("w.h5"), test::small_config(), DType::BF16);
    auto v = values(5);
    w.write(vector_spec(), v.data(), DType::F32);
    EXPECT_EQ(dir.entries().size(), 1u);  // the temporary file
    EXPECT_FALSE(std::filesystem::exists(dir.file("w.h5")));
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(WeightReader, RejectsNonWeightFiles) {
  test::ScratchDir dir;
  EXPECT_THROW(WeightReader(dir.file("absent.h5")), Error);
  test::write_raw_safetensors(dir.file("junk.h5"), "{}", {});
  try {
    WeightReader r(dir.file("junk.h5"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.h5: not an HDF5 file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lfm2
