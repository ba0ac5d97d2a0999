// The h5pack executable: exit codes, one-line errors "h5pack: error: <file>: <problem>", and the
// happy path of each subcommand.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io_test_util.h"

namespace lfm2 {
namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

Result run(const test::ScratchDir& dir, const std::string& args) {
  const std::string cmd =
      std::string(H5PACK_EXE) + " " + args + " >" + dir.file("stdout.txt") + " 2>" + dir.file("stderr.txt");
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(dir.file("stdout.txt"));
  r.err = slurp(dir.file("stderr.txt"));
  std::remove(dir.file("stdout.txt").c_str());
  std::remove(dir.file("stderr.txt").c_str());
  return r;
}

void expect_one_line_error(const Result& r, const std::string& file, const std::string& problem) {
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.rfind("h5pack: error: " + file, 0), 0u) << r.err;
  EXPECT_NE(r.err.find(problem), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(H5packCli, SubcommandsEndToEnd) {
  test::ScratchDir dir;
  Result r = run(dir, "synth " + dir.file("m.h5") + " --preset lfm2-tiny --seed 3 --dtype fp16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("100%"), std::string::npos);  // progress
  r = run(dir, "inspect " + dir.file("m.h5") + " --stages 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("weights fp16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters: 372.38 K (372384)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage 1: layers "), std::string::npos) << r.out;
  r = run(dir, "-q split " + dir.file("m.h5") + " --stages 2 " + dir.file("s-%d.h5"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "h5pack: wrote " + dir.file("s-0.h5") + "\nh5pack: wrote " + dir.file("s-1.h5") + "\n");
  test::CheckpointOptions opt;
  test::write_checkpoint(dir.file("ckpt"), test::small_config(), opt);
  r = run(dir, "-q convert " + dir.file("ckpt") + " " + dir.file("c.h5") + " --dtype fp32");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(dir, "inspect --brief " + dir.file("c.h5"));
  EXPECT_NE(r.out.find("weights fp32"), std::string::npos) << r.out;
  r = run(dir, "-q convert " + dir.file("ckpt") + " " + dir.file("c8.h5") + " --dtype fp8 --scheme block128");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(dir, "inspect --brief " + dir.file("c8.h5"));
  EXPECT_NE(r.out.find("fp8: e4m3 experts, fp32 scales per 128 x 128 block"), std::string::npos) << r.out;
  std::ofstream(dir.file("untied.json")) << test::small_config(false).to_json_text();
  r = run(dir, "-q synth " + dir.file("u.h5") + " --config " + dir.file("untied.json") + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(dir, "inspect " + dir.file("u.h5"));
  EXPECT_NE(r.out.find("untied head"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lm_head "), std::string::npos) << r.out;
}

TEST(H5packCli, WarnsAboutFp16Overflow) {
  test::ScratchDir dir;
  test::CheckpointOptions opt;
  const ModelConfig cfg = test::small_config();
  auto tensors = test::checkpoint_tensors(cfg, opt);
  tensors[0].values[3] = 1e6f;  // embed_tokens, bf16 holds it, fp16 does not
  test::write_checkpoint_tensors(dir.file("ckpt"), cfg, tensors);
  Result r = run(dir, "-q convert " + dir.file("ckpt") + " " + dir.file("c.h5") + " --dtype fp16");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.err.find("h5pack: warning: " + dir.file("ckpt/model.safetensors") +
                       ": tensor 'model.embed_tokens.weight': 1 values beyond the fp16 range"),
            std::string::npos)
      << r.err;
}

TEST(H5packCli, ErrorsAreOneLine) {
  test::ScratchDir dir;
  expect_one_line_error(run(dir, "synth " + dir.file("x.h5") + " --preset nope"), "", "unknown preset 'nope'");
  expect_one_line_error(run(dir, "inspect " + dir.file("none.h5")), dir.file("none.h5"), "no such file");
  expect_one_line_error(run(dir, "convert " + dir.file("none") + " " + dir.file("x.h5")), dir.file("none"),
                        "not a checkpoint directory");
  test::CheckpointOptions opt;
  test::write_checkpoint(dir.file("ckpt"), test::small_config(), opt);
  std::ofstream(dir.file("ckpt/model.safetensors"), std::ios::app) << "x";  // trailing byte is harmless
  std::filesystem::resize_file(dir.file("ckpt/model.safetensors"), 2000);
  expect_one_line_error(run(dir, "convert " + dir.file("ckpt") + " " + dir.file("x.h5")),
                        dir.file("ckpt/model.safetensors"), "truncated");
  expect_one_line_error(run(dir, "convert " + dir.file("ckpt") + " " + dir.file("x.h5") + " --dtype int4"), "",
                        "--dtype: 'int4' is not fp32, bf16, fp16 or fp8");
  expect_one_line_error(run(dir, "convert " + dir.file("ckpt") + " " + dir.file("x.h5") + " --scheme block128"),
                        dir.file("x.h5"), "--scheme and --dense go with --dtype fp8");
  expect_one_line_error(run(dir, "frobnicate"), "", "unknown subcommand 'frobnicate'");
  expect_one_line_error(run(dir, "synth " + dir.file("x.h5") + " --preset lfm2-tiny --threads 100000"), "",
                        "--threads: 100000 is more than 1024");
  expect_one_line_error(run(dir, "split " + dir.file("x.h5") + " " + dir.file("s%d.h5") + " --stages abc"), "",
                        "--stages: 'abc' is not a number");
  expect_one_line_error(run(dir, "split " + dir.file("x.h5") + " " + dir.file("s%d.h5")), "", "--stages is required");
  EXPECT_EQ(run(dir, "--help").code, 0);
  std::vector<std::string> left = dir.entries();
  EXPECT_EQ(left, std::vector<std::string>{"ckpt"});
}

// synth --text DIR: the text side of a checkpoint directory (the committed test tokenizer); inspect
// shows it; a bad file of DIR is one error naming it, and no output.
TEST(H5packCli, SynthCarriesATextSide) {
  test::ScratchDir dir;
  const std::string tok = std::string(LFM2_SOURCE_DIR) + "/tests/text/tokenizer";
  Result r = run(dir, "-q synth " + dir.file("m.h5") + " --preset lfm2-tiny --text " + tok);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(dir, "inspect --brief " + dir.file("m.h5"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("tokenizer: BPE, vocab 512 (14 added tokens, 14 special), bos <|startoftext|>, eos <|im_end|>"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("generation defaults: eos 7, 2 (generation_config.json)"), std::string::npos) << r.out;
  r = run(dir, "verify " + dir.file("m.h5"));
  EXPECT_NE(r.out.find("4 text files match their digests"), std::string::npos) << r.out;

  std::filesystem::create_directory(dir.file("bad"));
  std::ofstream(dir.file("bad/generation_config.json")) << "{\"eos_token_id\": 512}";
  expect_one_line_error(run(dir, "synth " + dir.file("b.h5") + " --preset lfm2-tiny --text " + dir.file("bad")),
                        dir.file("bad/generation_config.json"), "eos_token_id 512 is outside the model's vocabulary");
  expect_one_line_error(run(dir, "synth " + dir.file("b.h5") + " --preset lfm2-tiny --text " + dir.file("m.h5")),
                        "--text " + dir.file("m.h5"), "not a directory");
  EXPECT_FALSE(std::filesystem::exists(dir.file("b.h5")));
}

TEST(H5packCli, InterruptLeavesNoTemporaryFile) {
  // SIGINT while synth writes a 175 MB file: the process ends by the signal and removes its
  // OUT.h5.tmp.<pid>; there is no output either.
  test::ScratchDir dir;
  const std::string out = dir.file("mini.h5");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(H5PACK_EXE, H5PACK_EXE, "-q", "synth", out.c_str(), "--preset", "lfm2-mini", "--dtype", "fp32",
          "--threads", "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  bool started = false;
  for (int i = 0; i < 2000 && !started; ++i) {  // up to 20 s for the temporary file to appear
    for (const auto& name : dir.entries()) started |= name.find(".tmp.") != std::string::npos;
    if (!started) usleep(10000);
  }
  ASSERT_TRUE(started) << "synth never created its temporary file";
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) GTEST_SKIP() << "synth finished before the signal (exit " << WEXITSTATUS(status) << ")";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{});
}

}  // namespace
}  // namespace lfm2
