// XXH64 against the reference library's values, and the model identity a weight file carries: the
// same weights give the same fingerprint, any changed bit another, and a damaged tensor is found
// when read.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/xxhash64.h"
#include "h5pack/synth.h"
#include "io/h5_util.h"
#include "io/weight_file.h"
#include "io_test_util.h"

namespace lfm2 {
namespace {

TEST(Xxh64, MatchesReferenceVectors) {
  // Values from the reference implementation (libxxhash 0.8.1, XXH64).
  EXPECT_EQ(hex64(xxh64("", 0)), "ef46db3751d8e999");
  EXPECT_EQ(hex64(xxh64("a", 1)), "d24ec4f1a98c6e5b");
  EXPECT_EQ(hex64(xxh64("abc", 3)), "44bc2cf5ad770999");
  const std::string s = "Nobody inspects the spammish repetition";
  EXPECT_EQ(hex64(xxh64(s.data(), s.size())), "fbcea83c8a378bf1");
  std::string big;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 256; ++i) big += char(i);
  big += "xyz";
  EXPECT_EQ(hex64(xxh64(big.data(), big.size())), "e146cb31b65bc21a");
  EXPECT_EQ(hex64(xxh64(big.data(), big.size(), 12345)), "e323a559c0f2ee86");
  // Streaming in uneven pieces gives the same digest.
  Xxh64 h(12345);
  for (size_t at = 0, step = 1; at < big.size(); at += step, step = step * 2 + 1)
    h.update(big.data() + at, std::min(step, big.size() - at));
  EXPECT_EQ(hex64(h.digest()), "e323a559c0f2ee86");
  uint64_t v = 0;
  EXPECT_TRUE(parse_hex64("e323a559c0f2ee86", &v));
  EXPECT_EQ(v, 0xe323a559c0f2ee86ull);
  EXPECT_FALSE(parse_hex64("E323A559C0F2EE86", &v));
  EXPECT_FALSE(parse_hex64("123", &v));
}

TEST(ModelIdentity, FingerprintFollowsTheWeights) {
  test::ScratchDir dir;
  const ModelConfig cfg = test::small_config();
  SynthOptions opt;
  opt.progress = false;
  synth_weights(cfg, dir.file("a.h5"), opt);
  synth_weights(cfg, dir.file("b.h5"), opt);
  opt.seed = 1;
  synth_weights(cfg, dir.file("c.h5"), opt);
  const WeightReader a(dir.file("a.h5")), b(dir.file("b.h5")), c(dir.file("c.h5"));
  ASSERT_TRUE(a.identity() && b.identity() && c.identity());
  EXPECT_EQ(a.identity()->fingerprint, b.identity()->fingerprint);
  EXPECT_NE(a.identity()->fingerprint, c.identity()->fingerprint);
  EXPECT_EQ(a.identity()->tensor_digests.size(), model_tensor_specs(cfg).size());
}

TEST(ModelIdentity, DamagedTensorIsFoundWhenRead) {
  test::ScratchDir dir;
  const ModelConfig cfg = test::small_config();
  SynthOptions opt;
  opt.progress = false;
  opt.dtype = DType::F32;
  synth_weights(cfg, dir.file("m.h5"), opt);
  const TensorSpec spec = layer_tensor_specs(cfg, 1).back();
  haddr_t off = HADDR_UNDEF;
  {
    WeightReader r(dir.file("m.h5"));
    EXPECT_NO_THROW(r.read_f32(spec));
    EXPECT_EQ(r.tensors_verified(), 1);
    H5Handle d(H5Dopen2(r.file(), spec.path.c_str(), H5P_DEFAULT));
    off = H5Dget_offset(d.get());
  }
  ASSERT_NE(off, HADDR_UNDEF);
  std::FILE* f = std::fopen(dir.file("m.h5").c_str(), "r+b");
  std::fseek(f, long(off) + 2, SEEK_SET);
  std::fputc(0x7f, f);
  std::fclose(f);
  WeightReader r(dir.file("m.h5"));
  try {
    r.read_f32(spec);
    FAIL() << "a damaged tensor was read without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + spec.path + "' does not match its digest"), std::string::npos)
        << e.what();
  }
  r.set_verify(false);  // reads on, unchecked, when asked to
  EXPECT_NO_THROW(r.read_f32(spec));
}

}  // namespace
}  // namespace lfm2
