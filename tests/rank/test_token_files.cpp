// Token files: round trips of inputs and outputs, and every malformed input named in one line.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/error.h"
#include "io/h5_util.h"
#include "io/token_files.h"

namespace lfm2 {
namespace {

namespace fs = std::filesystem;

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lfm2_token_files_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes one dataset of any type / shape, as a foreign tool might.
  void write_raw(const std::string& file, const std::string& name, hid_t type, std::vector<hsize_t> dims,
                 const void* data) {
    h5_quiet();
    H5Handle f(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
    H5Handle d(H5Dcreate2(f.get(), name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(d.get(), 0);
    if (data) {
      ASSERT_GE(H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    }
  }

  // The error message of a call that must throw.
  template <typename F>
  std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }

  fs::path dir_;
};

TEST_F(TokenFiles, InputsRoundTrip) {
  TokenInputs in{3, 4, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 511}, {}};
  write_inputs(path("in.h5"), in);
  const TokenInputs back = read_inputs(path("in.h5"));
  EXPECT_EQ(back.n_seq, 3);
  EXPECT_EQ(back.seq_len, 4);
  EXPECT_EQ(back.ids, in.ids);
  EXPECT_NO_THROW(check_inputs(back, 512, 4, "in.h5"));
}

// Ragged prompts: lengths travel with the ids; padding is never checked against the vocabulary;
// a length of 0, past the padded row or of the wrong shape is named.
TEST_F(TokenFiles, LengthsRoundTripAndAreChecked) {
  TokenInputs in{3, 4, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4, 1, 2}};
  in.ids[5] = 9999;  // padding of sequence 1 (length 1): never read
  write_inputs(path("ragged.h5"), in);
  const TokenInputs back = read_inputs(path("ragged.h5"));
  EXPECT_EQ(back.lengths, in.lengths);
  EXPECT_EQ(back.length(1), 1);
  EXPECT_NO_THROW(check_inputs(back, 512, 4, "ragged.h5"));
  in.ids[4] = 9999;  // sequence 1's one token
  EXPECT_NE(error_of([&] { check_inputs(in, 512, 4, "r.h5"); }).find("input_ids[1, 0] = 9999"), std::string::npos);
  for (int32_t bad : {0, 5, -1}) {
    TokenInputs b{2, 4, std::vector<int32_t>(8, 1), {2, bad}};
    write_inputs(path("bad_len.h5"), b);
    EXPECT_NE(error_of([&] { read_inputs(path("bad_len.h5")); }).find("lengths[1] = " + std::to_string(bad) +
                                                                        " is outside [1, 4]"),
              std::string::npos);
  }
  const int32_t three[3] = {1, 1, 1};
  const int32_t ids[4] = {1, 2, 3, 4};
  write_raw(path("len_shape.h5"), "input_ids", H5T_NATIVE_INT32, {2, 2}, ids);
  {
    H5Handle f(H5Fopen(path("len_shape.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    hsize_t n = 3;
    H5Handle sp(H5Screate_simple(1, &n, nullptr));
    H5Handle d(H5Dcreate2(f.get(), "lengths", H5T_STD_I32LE, sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, three);
  }
  EXPECT_NE(error_of([&] { read_inputs(path("len_shape.h5")); }).find("lengths (3,) does not match input_ids (2"),
            std::string::npos);
}

// A replica's block: rows [begin, end), their first `width` tokens, their lengths; a bad id is
// named by its row in the file.
TEST_F(TokenFiles, BlockReadsRowsAndColumns) {
  TokenInputs in{4, 3, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 2, 1, 3}};
  write_inputs(path("in.h5"), in);
  const TokenInputs head = read_inputs_header(path("in.h5"));
  EXPECT_EQ(head.n_seq, 4);
  EXPECT_EQ(head.seq_len, 3);
  EXPECT_TRUE(head.ids.empty());
  EXPECT_EQ(head.lengths, in.lengths);
  const TokenInputs b = read_inputs_block(path("in.h5"), 1, 3, 2);
  EXPECT_EQ(b.n_seq, 2);
  EXPECT_EQ(b.seq_len, 2);
  EXPECT_EQ(b.ids, (std::vector<int32_t>{3, 4, 6, 7}));
  EXPECT_EQ(b.lengths, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(read_inputs_block(path("in.h5"), 3, 4, 3).ids, (std::vector<int32_t>{9, 10, 11}));
  // A prompt longer than the width asked for, and rows outside the file, are refused.
  EXPECT_NE(error_of([&] { read_inputs_block(path("in.h5"), 0, 2, 2); }).find("lengths[0] = 3 is outside [1, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_inputs_block(path("in.h5"), 2, 5, 3); }).find("rows [2, 5) x 3 tokens"),
            std::string::npos);
  TokenInputs bad = read_inputs_block(path("in.h5"), 2, 4, 3);
  bad.ids[3] = 999;
  EXPECT_NE(error_of([&] { check_inputs(bad, 512, 3, "in.h5", 2); }).find("input_ids[3, 0] = 999"),
            std::string::npos);
}

TEST_F(TokenFiles, GeneratedRoundTrips) {
  TokenOutputs out;
  out.n_seq = 2;
  out.vocab = 3;
  out.next_token = {1, 2};
  out.n_new = 3;
  out.generated = {1, 2, 0, 2, 2, 2};
  out.n_generated = {3, 1};
  write_outputs(path("gen.h5"), out, nlohmann::json::object());
  const TokenOutputs back = read_outputs(path("gen.h5"));
  EXPECT_EQ(back.generated, out.generated);
  EXPECT_EQ(back.n_generated, out.n_generated);
  const TokenAnswers a = read_answers(path("gen.h5"));
  EXPECT_EQ(a.n_new, 3);
  EXPECT_EQ(a.generated, out.generated);
}

TEST_F(TokenFiles, Int64InputsAreAccepted) {
  const int64_t ids[6] = {5, 4, 3, 2, 1, 0};
  write_raw(path("in64.h5"), "input_ids", H5T_NATIVE_INT64, {2, 3}, ids);
  EXPECT_EQ(read_inputs(path("in64.h5")).ids, (std::vector<int32_t>{5, 4, 3, 2, 1, 0}));
}

TEST_F(TokenFiles, OutputsRoundTripBitExactWithMetadata) {
  TokenOutputs out;
  out.n_seq = 2;
  out.seq_len = 3;
  out.vocab = 4;
  out.next_token = {3, 1};
  out.logits = {0.1f, -2.5f, 1e-30f, 7.0f, 1, 9, 2, 3};
  for (int i = 0; i < 24; ++i) out.all_logits.push_back(float(i) * 0.37f - 3.0f);
  write_outputs(path("out.h5"), out, {{"n_ranks", 4}, {"dtype", "fp32"}, {"wall_s", 0.5}, {"all_logits", true}});
  const TokenOutputs back = read_outputs(path("out.h5"));
  EXPECT_EQ(back.next_token, out.next_token);
  EXPECT_EQ(back.logits, out.logits);
  EXPECT_EQ(back.all_logits, out.all_logits);
  EXPECT_EQ(back.seq_len, 3);
  H5Handle f(H5Fopen(path("out.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  EXPECT_EQ(h5_read_attr_int(f.get(), "n_ranks", "out"), 4);
  EXPECT_EQ(h5_read_attr_string(f.get(), "dtype", "out"), "fp32");
  // Outputs are valid answers.
  const TokenAnswers a = read_answers(path("out.h5"));
  EXPECT_EQ(a.vocab, 4);
  EXPECT_NO_THROW(check_answers(a, 2, 4, "out.h5"));
  // Atomic: nothing but the file itself is left behind.
  int n_files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) n_files += e.path().filename() == "out.h5" ? 0 : 1;
  EXPECT_EQ(n_files, 0);
}

// What --results checks of an inputs file at start-up: the first request field it lacks, in
// request_datasets() order, and the tokenizer's fingerprint the front end stamped on it.
TEST_F(TokenFiles, ProvenanceNamesTheFirstMissingRequestField) {
  TokenInputs in{2, 3, {1, 2, 3, 4, 5, 6}, {3, 2}};
  write_inputs(path("in.h5"), in);  // input_ids and lengths only: no request_id
  InputsProvenance p = read_inputs_provenance(path("in.h5"));
  EXPECT_EQ(p.missing_dataset, "request_id");
  EXPECT_EQ(p.text_fingerprint, "");
  {
    H5Handle f(H5Fopen(path("in.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    const std::vector<hsize_t> dims{2};
    H5Handle space(H5Screate_simple(1, dims.data(), nullptr));
    for (const char* name : {"request_id", "stop"})
      H5Handle(H5Dcreate2(f.get(), name, H5T_NATIVE_INT32, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    h5_write_attr(f.get(), "text_fingerprint", std::string("0123456789abcdef"));
  }
  p = read_inputs_provenance(path("in.h5"));
  EXPECT_EQ(p.missing_dataset, "max_new_tokens");  // lengths is there
  EXPECT_EQ(p.text_fingerprint, "0123456789abcdef");
  EXPECT_EQ(request_datasets(), (std::vector<std::string>{"request_id", "stop", "lengths", "max_new_tokens"}));
  EXPECT_NE(error_of([&] { read_inputs_provenance(path("none.h5")); }).find("none.h5: no such inputs file"),
            std::string::npos);
}

TEST_F(TokenFiles, FailedWriteLeavesNothing) {
  TokenOutputs out;
  out.n_seq = 1;
  out.vocab = 2;
  out.next_token = {0};
  out.logits = {1, 2, 3};  // wrong size
  EXPECT_THROW(write_outputs(path("bad.h5"), out, nlohmann::json::object()), Error);
  EXPECT_TRUE(fs::is_empty(dir_));
  EXPECT_THROW(write_outputs(path("no/such/dir/o.h5"), TokenOutputs{}, nlohmann::json::object()), Error);
}

TEST_F(TokenFiles, MalformedInputsAreNamed) {
  EXPECT_NE(error_of([&] { read_inputs(path("missing.h5")); }).find("missing.h5: no such inputs file"),
            std::string::npos);
  std::FILE* f = std::fopen(path("junk.h5").c_str(), "w");
  std::fputs("not hdf5", f);
  std::fclose(f);
  EXPECT_NE(error_of([&] { read_inputs(path("junk.h5")); }).find("not an HDF5 file"), std::string::npos);

  const int32_t row[3] = {1, 2, 3};
  write_raw(path("rank1.h5"), "input_ids", H5T_NATIVE_INT32, {3}, row);
  EXPECT_NE(error_of([&] { read_inputs(path("rank1.h5")); }).find("expected rank 2"), std::string::npos);
  write_raw(path("other.h5"), "tokens", H5T_NATIVE_INT32, {1, 3}, row);
  EXPECT_NE(error_of([&] { read_inputs(path("other.h5")); }).find("no dataset 'input_ids'"), std::string::npos);
  const float fl[3] = {1, 2, 3};
  write_raw(path("float.h5"), "input_ids", H5T_NATIVE_FLOAT, {1, 3}, fl);
  EXPECT_NE(error_of([&] { read_inputs(path("float.h5")); }).find("wrong type"), std::string::npos);
  write_raw(path("empty.h5"), "input_ids", H5T_NATIVE_INT32, {2, 0}, nullptr);
  EXPECT_NE(error_of([&] { read_inputs(path("empty.h5")); }).find("empty sequences"), std::string::npos);
  write_raw(path("none.h5"), "input_ids", H5T_NATIVE_INT32, {0, 5}, nullptr);
  EXPECT_NE(error_of([&] { read_inputs(path("none.h5")); }).find("no sequences"), std::string::npos);
}

TEST_F(TokenFiles, TokenRangeAndLengthChecks) {
  TokenInputs in{2, 3, {0, 1, 2, 3, -1, 5}, {}};
  EXPECT_NE(error_of([&] { check_inputs(in, 512, 8, "x.h5"); }).find("input_ids[1, 1] = -1 is outside"),
            std::string::npos);
  in.ids[4] = 512;
  EXPECT_NE(error_of([&] { check_inputs(in, 512, 8, "x.h5"); }).find("= 512 is outside the vocabulary [0, 512)"),
            std::string::npos);
  in.ids[4] = 511;
  EXPECT_NO_THROW(check_inputs(in, 512, 3, "x.h5"));
  EXPECT_NE(error_of([&] { check_inputs(in, 512, 2, "x.h5"); }).find("longer than the model's max_position"),
            std::string::npos);
}

TEST_F(TokenFiles, AnswersMustMatchTheInputs) {
  TokenOutputs ans;
  ans.n_seq = 3;
  ans.vocab = 4;
  ans.next_token = {0, 1, 3};
  ans.logits.assign(12, 0.5f);
  write_outputs(path("ans.h5"), ans, nlohmann::json::object());
  const TokenAnswers a = read_answers(path("ans.h5"));
  EXPECT_NO_THROW(check_answers(a, 3, 4, "ans.h5"));
  EXPECT_NE(error_of([&] { check_answers(a, 4, 4, "ans.h5"); }).find("next_token has 3 entries, the inputs have 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_answers(a, 3, 8, "ans.h5"); }).find("vocabulary of 8"), std::string::npos);
  const int32_t nt[2] = {0, 1};
  const float lg[6] = {0, 0, 0, 0, 0, 0};
  write_raw(path("mismatch.h5"), "next_token", H5T_NATIVE_INT32, {2}, nt);
  {
    H5Handle f(H5Fopen(path("mismatch.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    hsize_t dims[2] = {3, 2};
    H5Handle space(H5Screate_simple(2, dims, nullptr));
    H5Handle d(H5Dcreate2(f.get(), "logits", H5T_NATIVE_FLOAT, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, lg);
  }
  EXPECT_NE(error_of([&] { read_answers(path("mismatch.h5")); }).find("does not match next_token"), std::string::npos);
}

}  // namespace
}  // namespace lfm2
