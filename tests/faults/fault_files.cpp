// Fixture tool of the fault table (tests/faults): writes damaged or unusual files from good ones.
//   fault_files poison MODEL OUT TENSOR VALUE   a consistent copy (fresh digests and fingerprint) with
//                                               element 0 of TENSOR set to VALUE (nan, inf, -inf, 1e30)
//   fault_files flip MODEL OUT TENSOR           a byte copy with one byte of TENSOR's data flipped
//   fault_files strip MODEL OUT                 a byte copy without model_fingerprint / tensor_digests
//                                               (as an older h5pack wrote it)
//   fault_files attr FILE NAME VALUE            sets a root attribute in place (an integer if VALUE is one)
//   fault_files drop FILE DATASET               removes a dataset in place
//   fault_files inputs OUT N S VOCAB [float]    an inputs file of N x S ids (float: input_ids as floats)
//   fault_files checkpoint DIR                  a small Hugging Face checkpoint (config.json + safetensors)
#include <hdf5.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/h5_util.h"
#include "io/seq_params.h"
#include "io/token_files.h"
#include "io/weight_file.h"
#include "io_test_util.h"

namespace fs = std::filesystem;
using namespace lfm2;

namespace {

void poison(const std::string& model, const std::string& out, const std::string& tensor, const std::string& value) {
  WeightReader r(model);
  WeightWriter w(out, r.config(), r.weight_dtype());
  bool found = false;
  for (const TensorSpec& spec : model_tensor_specs(r.config())) {
    if (!r.has(spec.path)) continue;
    std::vector<float> v = r.read_f32(spec);
    if (spec.path == tensor) {
      v[0] = std::strtof(value.c_str(), nullptr);
      found = true;
    }
    w.write(spec, v.data(), DType::F32);
  }
  LFM2_CHECK(found, model, ": no tensor '", tensor, "'");
  w.commit();
}

void flip(const std::string& model, const std::string& out, const std::string& tensor) {
  fs::copy_file(model, out, fs::copy_options::overwrite_existing);
  haddr_t off = HADDR_UNDEF;
  {
    WeightReader r(out);
    H5Handle d(H5Dopen2(r.file(), tensor.c_str(), H5P_DEFAULT));
    H5_CHECK(d.get(), out, ": ", tensor);
    off = H5Dget_offset(d.get());
  }
  LFM2_CHECK(off != HADDR_UNDEF, out, ": ", tensor, " has no offset");
  std::FILE* f = std::fopen(out.c_str(), "r+b");
  LFM2_CHECK(f, out, ": cannot open");
  std::fseek(f, long(off) + 1, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, long(off) + 1, SEEK_SET);
  std::fputc(c ^ 0x10, f);
  std::fclose(f);
}

void set_attr(const std::string& file, const std::string& name, const std::string& value) {
  H5Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5_CHECK(f.get(), file, ": cannot open");
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (!value.empty() && *end == '\0')
    h5_write_attr(f.get(), name, int64_t(v));
  else
    h5_write_attr(f.get(), name, value);
  H5_CHECK(H5Fclose(f.release()), file, ": closing");
}

void strip(const std::string& model, const std::string& out) {
  fs::copy_file(model, out, fs::copy_options::overwrite_existing);
  H5Handle f(H5Fopen(out.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5_CHECK(f.get(), out, ": cannot open");
  for (const char* a : {"model_fingerprint", "tensor_digests"})
    if (H5Aexists(f.get(), a) > 0) H5_CHECK(H5Adelete(f.get(), a), out, ": deleting ", a);
  H5_CHECK(H5Fclose(f.release()), out, ": closing");
}

void drop(const std::string& file, const std::string& dataset) {
  H5Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  H5_CHECK(f.get(), file, ": cannot open");
  H5_CHECK(H5Ldelete(f.get(), dataset.c_str(), H5P_DEFAULT), file, ": deleting ", dataset);
  H5_CHECK(H5Fclose(f.release()), file, ": closing");
}

void inputs(const std::string& out, int64_t n, int64_t s, int64_t vocab, bool as_float) {
  TokenInputs in{n, s, {}, {}};
  for (int64_t i = 0; i < n * s; ++i) in.ids.push_back(int32_t((i * 7919 + 13) % vocab));
  if (!as_float) return write_inputs(out, in);
  std::vector<float> f(in.ids.begin(), in.ids.end());
  H5Handle file(H5Fcreate(out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  hsize_t dims[2] = {hsize_t(n), hsize_t(s)};
  H5Handle space(H5Screate_simple(2, dims, nullptr));
  H5Handle d(H5Dcreate2(file.get(), "input_ids", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f.data()), out);
}

// A copy of inputs `in` with one per-sequence dataset (io/seq_params.h): -1 (the flag's) everywhere
// but `value` at row `row`.
void param(const std::string& in_path, const std::string& out, const std::string& name, const std::string& value,
           int64_t row) {
  const TokenInputs in = read_inputs(in_path);
  write_inputs(out, in);
  SeqParamsBlock p;
  p.n = in.n_seq;
  LFM2_CHECK(row >= 0 && row < in.n_seq, "param: row ", row, " of ", in.n_seq);
  const size_t n = size_t(in.n_seq), r = size_t(row);
  if (name == "max_new_tokens") (p.max_new_tokens.assign(n, -1), p.max_new_tokens[r] = int32_t(std::stoll(value)));
  else if (name == "top_k") (p.top_k.assign(n, -1), p.top_k[r] = int32_t(std::stoll(value)));
  else if (name == "temperature") (p.temperature.assign(n, -1), p.temperature[r] = std::stof(value));
  else if (name == "top_p") (p.top_p.assign(n, -1), p.top_p[r] = std::stof(value));
  else if (name == "seed") (p.seed.assign(n, -1), p.seed[r] = std::stoll(value));
  else LFM2_FAIL("param: no per-sequence parameter '", name, "'");
  write_seq_params(out, p);
}

}  // namespace

int main(int argc, char** argv) {
  h5_no_exit_handlers();
  CLI::App app{"fixture tool of the fault table"};
  app.require_subcommand(1);
  std::string a, b, c, d;
  int64_t n = 0, s = 0, v = 0;
  auto* po = app.add_subcommand("poison", "");
  po->add_option("model", a)->required();
  po->add_option("out", b)->required();
  po->add_option("tensor", c)->required();
  po->add_option("value", d)->required();
  auto* fl = app.add_subcommand("flip", "");
  fl->add_option("model", a)->required();
  fl->add_option("out", b)->required();
  fl->add_option("tensor", c)->required();
  auto* st = app.add_subcommand("strip", "");
  st->add_option("model", a)->required();
  st->add_option("out", b)->required();
  auto* at = app.add_subcommand("attr", "");
  at->add_option("file", a)->required();
  at->add_option("name", b)->required();
  at->add_option("value", c)->required();
  auto* dr = app.add_subcommand("drop", "");
  dr->add_option("file", a)->required();
  dr->add_option("dataset", b)->required();
  auto* pa = app.add_subcommand("param", "");
  pa->add_option("in", a)->required();
  pa->add_option("out", b)->required();
  pa->add_option("name", c)->required();
  pa->add_option("value", d)->required();
  pa->add_option("row", n)->required();
  auto* in = app.add_subcommand("inputs", "");
  in->add_option("out", a)->required();
  in->add_option("n", n)->required();
  in->add_option("s", s)->required();
  in->add_option("vocab", v)->required();
  in->add_option("kind", c);
  auto* ck = app.add_subcommand("checkpoint", "");
  ck->add_option("dir", a)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    h5_quiet();
    if (*po) poison(a, b, c, d);
    if (*fl) flip(a, b, c);
    if (*st) strip(a, b);
    if (*at) set_attr(a, b, c);
    if (*dr) drop(a, b);
    if (*in) inputs(a, n, s, v, c == "float");
    if (*pa) param(a, b, c, d, n);
    if (*ck) test::write_checkpoint(a, test::small_config(), test::CheckpointOptions{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_files: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
