// The text side of a weight file (io/model_text.h): convert stores the checkpoint's tokenizer,
// chat template and generation files verbatim with digests; split carries them to every stage;
// verify checks them; inspect shows them; files without them still load; bad text files are one
// error naming the file, with no output left.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "h5pack/convert.h"
#include "h5pack/inspect.h"
#include "h5pack/split.h"
#include "h5pack/verify.h"
#include "io/weight_file.h"
#include "io_test_util.h"

namespace lfm2 {
namespace {

using test::ScratchDir;

// A tokenizers-shaped file: a BPE vocabulary of 40 ids and 3 added special tokens (ids 40-42).
std::string tokenizer_json(int first_added = 40) {
  std::string vocab;
  for (int i = 0; i < 40; ++i) vocab += (i ? "," : "") + std::string("\"t") + std::to_string(i) + "\":" + std::to_string(i);
  return "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":" + std::to_string(first_added) +
         ",\"content\":\"<|startoftext|>\",\"special\":true},{\"id\":" + std::to_string(first_added + 1) +
         ",\"content\":\"<|im_end|>\",\"special\":true},{\"id\":" + std::to_string(first_added + 2) +
         ",\"content\":\"<|im_start|>\",\"special\":true}],\"model\":{\"type\":\"BPE\",\"vocab\":{" + vocab +
         "},\"merges\":[]}}";
}

const char* kTemplate = "{{- bos_token -}}\n{%- for m in messages -%}\n{{- '<|im_start|>' + m['role'] + '\\n' -}}\n{%- endfor -%}";

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A checkpoint of small_config() (vocab 96) with a tokenizer, its config (template inside) and
// generation_config.json.
ModelConfig checkpoint_with_text(const ScratchDir& dir) {
  const ModelConfig cfg = test::small_config();
  test::write_checkpoint(dir.file("ckpt"), cfg, {});
  write_file(dir.file("ckpt/tokenizer.json"), tokenizer_json());
  nlohmann::json tc = {{"bos_token", "<|startoftext|>"}, {"eos_token", "<|im_end|>"}, {"chat_template", kTemplate}};
  write_file(dir.file("ckpt/tokenizer_config.json"), tc.dump(2));
  write_file(dir.file("ckpt/generation_config.json"), R"({"bos_token_id": 40, "eos_token_id": [41, 2], "temperature": 0.3})");
  return cfg;
}

TEST(ModelText, ConvertStoresTheFilesVerbatimAndTheFingerprintIgnoresThem) {
  ScratchDir dir;
  const ModelConfig cfg = checkpoint_with_text(dir);
  convert_checkpoint(dir.file("ckpt"), dir.file("with.h5"), DType::F32);
  const ModelText text = read_model_text(dir.file("with.h5"));
  ASSERT_EQ(text.files.size(), 3u);
  EXPECT_EQ(text.at("tokenizer.json"), tokenizer_json());
  EXPECT_NE(text.at("tokenizer_config.json").find("\"chat_template\""), std::string::npos);
  EXPECT_FALSE(text.has("special_tokens_map.json"));

  const GenerationDefaults g = generation_defaults(text);
  EXPECT_EQ(g.eos_ids, (std::vector<int32_t>{41, 2}));
  EXPECT_EQ(g.eos_source, "generation_config.json");
  EXPECT_EQ(g.bos_id, 40);
  ASSERT_TRUE(g.temperature.has_value());
  EXPECT_DOUBLE_EQ(*g.temperature, 0.3);
  const TokenizerSummary t = summarize_tokenizer(text);
  EXPECT_EQ(t.vocab_size, 43);
  EXPECT_EQ(t.added_tokens, 3);
  EXPECT_EQ(t.template_bytes, int64_t(std::string(kTemplate).size()));
  EXPECT_EQ(t.template_source, "tokenizer_config.json");
  EXPECT_EQ(token_id(text, "<|im_start|>"), 42);
  EXPECT_EQ(token_id(text, "t7"), 7);

  // The same weights without the text side: same model fingerprint, same tensor offsets (the text
  // lies after every tensor, so the stages' byte ranges do not move).
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::remove(dir.file(std::string("ckpt/") + name));
  convert_checkpoint(dir.file("ckpt"), dir.file("without.h5"), DType::F32);
  EXPECT_TRUE(read_model_text(dir.file("without.h5")).empty());
  WeightReader a(dir.file("with.h5")), b(dir.file("without.h5"));
  EXPECT_EQ(a.identity()->fingerprint, b.identity()->fingerprint);
  const InspectReport ra = inspect_weights(dir.file("with.h5")), rb = inspect_weights(dir.file("without.h5"));
  ASSERT_EQ(ra.datasets.size(), rb.datasets.size());
  for (size_t i = 0; i < ra.datasets.size(); ++i) EXPECT_EQ(ra.datasets[i].offset, rb.datasets[i].offset);
  (void)cfg;
}

TEST(ModelText, SplitCarriesItToEveryStageAndVerifyChecksIt) {
  ScratchDir dir;
  checkpoint_with_text(dir);
  convert_checkpoint(dir.file("ckpt"), dir.file("m.h5"), DType::BF16);
  const ModelText whole = read_model_text(dir.file("m.h5"));
  const auto stages = split_weights(dir.file("m.h5"), 2, dir.file("s%d.h5"), "", false);
  for (const auto& s : stages) {
    EXPECT_EQ(read_model_text(s).files, whole.files) << s;
    const VerifyReport r = verify_weights(s, false);
    EXPECT_EQ(r.text_files, 3);
    EXPECT_EQ(r.text_fingerprint, hex64(text_fingerprint(whole)));
  }

  // One byte of the tokenizer changed in place: verify names it, the weights still load.
  {
    H5Handle f(H5Fopen(dir.file("m.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    H5Handle d(H5Dopen2(f.get(), "text/tokenizer.json", H5P_DEFAULT));
    const hsize_t at = 5, one = 1;
    H5Handle fs(H5Dget_space(d.get()));
    H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, &at, nullptr, &one, nullptr);
    H5Handle ms(H5Screate_simple(1, &one, nullptr));
    const uint8_t x = 'X';
    ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_UINT8, ms.get(), fs.get(), H5P_DEFAULT, &x), 0);
  }
  try {
    verify_weights(dir.file("m.h5"), false);
    FAIL() << "a damaged tokenizer passed verify";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text/tokenizer.json does not match its digest"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(WeightReader r(dir.file("m.h5")));
  EXPECT_NO_THROW(read_model_text(dir.file("m.h5"), false));
}

TEST(ModelText, InspectShowsIt) {
  ScratchDir dir;
  checkpoint_with_text(dir);
  convert_checkpoint(dir.file("ckpt"), dir.file("m.h5"), DType::F32);
  const std::string text = format_report(inspect_weights(dir.file("m.h5")), true);
  EXPECT_NE(text.find("tokenizer: BPE, vocab 43 (3 added tokens, 3 special), bos <|startoftext|>, eos <|im_end|>"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("chat template: " + std::to_string(std::string(kTemplate).size()) + " bytes (tokenizer_config.json)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("generation defaults: eos 41, 2 (generation_config.json), temperature 0.3"), std::string::npos)
      << text;
  test::write_checkpoint(dir.file("bare"), test::small_config(), {});
  convert_checkpoint(dir.file("bare"), dir.file("bare.h5"), DType::F32);
  EXPECT_NE(format_report(inspect_weights(dir.file("bare.h5")), true).find("text side: none"), std::string::npos);
}

TEST(ModelText, TemplateFileWinsAndEosFallsBackToTheTokenizerConfig) {
  ScratchDir dir;
  checkpoint_with_text(dir);
  write_file(dir.file("ckpt/chat_template.jinja"), "{{ messages[0]['content'] }}");
  write_file(dir.file("ckpt/generation_config.json"), R"({"bos_token_id": 40})");
  convert_checkpoint(dir.file("ckpt"), dir.file("m.h5"), DType::F32);
  const ModelText text = read_model_text(dir.file("m.h5"));
  const TokenizerSummary t = summarize_tokenizer(text);
  EXPECT_EQ(t.template_source, "chat_template.jinja");
  EXPECT_EQ(t.template_bytes, 28);
  const GenerationDefaults g = generation_defaults(text);
  EXPECT_EQ(g.eos_ids, std::vector<int32_t>{41});  // tokenizer_config's eos_token <|im_end|>
  EXPECT_EQ(g.eos_source, "tokenizer_config.json");
}

// Each bad text file: one error naming the checkpoint's file, and no output.
TEST(ModelText, BadFilesAreRefusedBeforeAnyOutput) {
  struct Case {
    std::string file, content, problem;
  };
  const std::vector<Case> cases = {
      {"generation_config.json", "{\"eos_token_id\": 2,", "generation_config.json: not JSON"},
      {"generation_config.json", "{\"eos_token_id\": 96}", "eos_token_id 96 is outside the model's vocabulary [0, 96)"},
      {"generation_config.json", "{\"eos_token_id\": [2, \"x\"]}", "eos_token_id holds \"x\", not a token id"},
      {"generation_config.json", "[1, 2]", "generation_config.json: is JSON but not an object"},
      {"tokenizer_config.json", "{\"chat_template\": 7}", "chat_template is neither a string nor a list"},
      {"tokenizer.json", "{\"version\": \"1.0\"}", "tokenizer.json: has no model with a vocabulary"},
  };
  for (const Case& c : cases) {
    ScratchDir dir;
    checkpoint_with_text(dir);
    write_file(dir.file("ckpt/" + c.file), c.content);
    try {
      convert_checkpoint(dir.file("ckpt"), dir.file("m.h5"), DType::F32);
      ADD_FAILURE() << c.file << " " << c.content << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(dir.file("ckpt/"), 0), 0u) << msg;
      EXPECT_NE(msg.find(c.problem), std::string::npos) << msg;
    }
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt"}) << c.content;
  }
  ScratchDir dir;
  checkpoint_with_text(dir);
  std::filesystem::remove(dir.file("ckpt/tokenizer.json"));
  ASSERT_EQ(mkfifo(dir.file("ckpt/tokenizer.json").c_str(), 0600), 0);
  EXPECT_THROW(convert_checkpoint(dir.file("ckpt"), dir.file("m.h5"), DType::F32), Error);  // never blocks
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.h5")));
}

TEST(ModelText, ATokenizerPastTheModelsVocabularyIsAWarning) {
  ModelText text;
  text.files["tokenizer.json"] = tokenizer_json(70);
  const auto warnings = check_model_text(text, 64);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ids reach 72, past the model's vocabulary [0, 64)"), std::string::npos) << warnings[0];
  EXPECT_TRUE(check_model_text(text, 100).empty());
}

}  // namespace
}  // namespace lfm2
