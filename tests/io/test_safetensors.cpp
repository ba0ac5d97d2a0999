// The safetensors reader: good files and shards, and every kind of corrupt input with a one-line
// error naming the file and the tensor.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace lfm2 {
namespace {

using test::ScratchDir;
using test::StTensor;

std::vector<StTensor> two_tensors() {
  return {{"a", DType::BF16, {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", DType::F32, {4}, {-1, 0.5f, 0.25f, 8}}};
}

// Runs `f`, expects an lfm2::Error whose one-line message contains every part.
template <typename F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(Safetensors, ReadsWholeTensorsAndRanges) {
  ScratchDir dir;
  test::write_safetensors(dir.file("model.safetensors"), two_tensors());
  SafetensorsCheckpoint ck(dir.path());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck.info("a").dtype, DType::BF16);
  EXPECT_EQ(ck.info("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ck.info("a").nbytes, 12u);
  uint16_t a[6];
  ck.read("a", a);
  EXPECT_EQ(a[0], 0x3f80);  // 1.0
  EXPECT_EQ(a[5], 0x40c0);  // 6.0
  float b[2];
  ck.read_elements("b", 2, 2, b);
  EXPECT_EQ(b[0], 0.25f);
  EXPECT_EQ(b[1], 8.0f);
  EXPECT_THROW(ck.read_elements("b", 3, 2, b), Error);
  expect_error([&] { ck.info("c"); }, {dir.path(), "'c' is missing"});
}

TEST(Safetensors, ReadsShardsThroughIndex) {
  ScratchDir dir;
  auto t = two_tensors();
  test::write_safetensors(dir.file("s1.safetensors"), {t[0]});
  test::write_safetensors(dir.file("s2.safetensors"), {t[1]});
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})";
  SafetensorsCheckpoint ck(dir.path());
  EXPECT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.info("b").file, dir.file("s2.safetensors"));
  float b[4];
  ck.read("b", b);
  EXPECT_EQ(b[3], 8.0f);
}

TEST(Safetensors, MissingFiles) {
  ScratchDir dir;
  expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, {dir.path(), "no model.safetensors"});
  expect_error([&] { SafetensorsCheckpoint ck(dir.file("x.safetensors")); }, {"x.safetensors", "no such file"});
  // A FIFO is refused before it is opened (open() would block until a writer came).
  ASSERT_EQ(::mkfifo(dir.file("f.safetensors").c_str(), 0644), 0);
  expect_error([&] { SafetensorsCheckpoint ck(dir.file("f.safetensors")); }, {"f.safetensors", "is a FIFO"});
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"weight_map": {"a": "gone.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, {"index.json", "gone.safetensors", "does not exist"});
}

TEST(Safetensors, IndexMismatches) {
  ScratchDir dir;
  auto t = two_tensors();
  test::write_safetensors(dir.file("s1.safetensors"), {t[0], t[1]});
  test::write_safetensors(dir.file("s2.safetensors"), {t[1]});
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, {"s2.safetensors", "tensor 'b'", "duplicated"});
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"weight_map": {"a": "s1.safetensors", "c": "s1.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, {"index.json", "'c'", "not in it"});
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"weight_map": )";
  expect_error([&] { SafetensorsCheckpoint ck(dir.path()); }, {"index.json", "invalid JSON"});
}

TEST(Safetensors, Truncated) {
  ScratchDir dir;
  test::write_safetensors(dir.file("full.safetensors"), two_tensors());
  const auto size = std::filesystem::file_size(dir.file("full.safetensors"));
  std::filesystem::copy_file(dir.file("full.safetensors"), dir.file("cut.safetensors"));
  std::filesystem::resize_file(dir.file("cut.safetensors"), size - 1);  // last data byte gone
  expect_error([&] { SafetensorsCheckpoint ck(dir.file("cut.safetensors")); },
               {"cut.safetensors", "tensor 'b'", "truncated"});
  std::filesystem::resize_file(dir.file("cut.safetensors"), 40);  // inside the header
  expect_error([&] { SafetensorsCheckpoint ck(dir.file("cut.safetensors")); }, {"cut.safetensors", "truncated"});
  std::filesystem::resize_file(dir.file("cut.safetensors"), 5);  // inside the length
  expect_error([&] { SafetensorsCheckpoint ck(dir.file("cut.safetensors")); }, {"cut.safetensors", "truncated"});
}

TEST(Safetensors, CorruptHeaders) {
  ScratchDir dir;
  const std::string f = dir.file("bad.safetensors");
  const std::vector<uint8_t> data(24, 0);
  auto open = [&] { SafetensorsCheckpoint ck(f); };

  test::write_raw_safetensors(f, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})", data);
  expect_error(open, {"bad.safetensors", "invalid header JSON"});

  test::write_raw_safetensors(f, R"([1, 2])", data);
  expect_error(open, {"bad.safetensors", "not an object"});

  test::write_raw_safetensors(f, R"({"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", data);
  expect_error(open, {"bad.safetensors", "tensor 'a'", "unsupported dtype I64"});

  test::write_raw_safetensors(f, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data);
  expect_error(open, {"bad.safetensors", "tensor 'a'", "8 bytes but shape [3]"});

  test::write_raw_safetensors(f, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", data);
  expect_error(open, {"bad.safetensors", "tensor 'a'", "backwards"});

  test::write_raw_safetensors(f, R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", data);
  expect_error(open, {"bad.safetensors", "tensor 'a'", "past the end"});

  test::write_raw_safetensors(f,
                              R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                  "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                              data);
  expect_error(open, {"bad.safetensors", "tensor 'b' overlaps tensor 'a'"});

  test::write_raw_safetensors(f, R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", data);
  expect_error(open, {"bad.safetensors", "tensor 'a'", "bad dimension"});

  test::write_raw_safetensors(f, R"({"a": {"dtype": "F32", "shape": [1]}})", data);
  expect_error(open, {"bad.safetensors", "tensor 'a'", "data_offsets"});

  // A header length far beyond the file: not a safetensors file at all.
  std::ofstream(f, std::ios::binary) << "this is not a safetensors file";
  expect_error(open, {"bad.safetensors"});
}

}  // namespace
}  // namespace lfm2
