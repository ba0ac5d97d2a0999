#include "io/model_identity.h"

#include "common/error.h"
#include "common/xxhash64.h"
#include "io/h5_util.h"

namespace lfm2 {

namespace {
constexpr const char* kFingerprintAttr = "model_fingerprint";
constexpr const char* kDigestsAttr = "tensor_digests";
}  // namespace

uint64_t model_fingerprint(const std::string& config_json, DType weight_dtype, const std::vector<TensorSpec>& specs,
                           const std::vector<uint64_t>& digests) {
  LFM2_CHECK(specs.size() == digests.size(), "model fingerprint: ", digests.size(), " digests for ", specs.size(),
             " tensors");
  std::string text = "lfm2-rank model fingerprint 1\n";
  text += dtype_name(weight_dtype);
  text += "\n" + config_json + "\n";
  for (size_t i = 0; i < specs.size(); ++i) text += specs[i].path + " " + hex64(digests[i]) + "\n";
  return xxh64(text.data(), text.size());
}

void write_model_identity(hid_t file, const ModelIdentity& id) {
  h5_write_attr(file, kFingerprintAttr, hex64(id.fingerprint));
  const hsize_t n = id.tensor_digests.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr));
  if (H5Aexists(file, kDigestsAttr) > 0) H5Adelete(file, kDigestsAttr);
  H5Handle attr(H5Acreate2(file, kDigestsAttr, H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(attr.get(), "creating attribute ", kDigestsAttr);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_UINT64, id.tensor_digests.data()), "writing attribute ", kDigestsAttr);
}

std::optional<ModelIdentity> read_model_identity(hid_t file, const std::string& where, const std::string& config_json,
                                                 DType weight_dtype, const std::vector<TensorSpec>& specs) {
  const bool has_fp = h5_has_attr(file, kFingerprintAttr), has_digests = h5_has_attr(file, kDigestsAttr);
  if (!has_fp && !has_digests) return std::nullopt;
  LFM2_CHECK(has_fp && has_digests, where, ": has ", has_fp ? kFingerprintAttr : kDigestsAttr, " but not ",
             has_fp ? kDigestsAttr : kFingerprintAttr, " (a damaged file)");
  ModelIdentity id;
  const std::string text = h5_read_attr_string(file, kFingerprintAttr, where);
  LFM2_CHECK(parse_hex64(text, &id.fingerprint), where, ": model_fingerprint '", text,
             "' is not 16 hex digits (a damaged file)");
  H5Handle attr(H5Aopen(file, kDigestsAttr, H5P_DEFAULT));
  H5_CHECK(attr.get(), where, ": opening attribute ", kDigestsAttr);
  H5Handle space(H5Aget_space(attr.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  LFM2_CHECK(n == hssize_t(specs.size()) && H5Sget_simple_extent_ndims(space.get()) == 1, where, ": ", kDigestsAttr,
             " holds ", n, " digests for the ", specs.size(), " tensors of the model (a damaged file)");
  id.tensor_digests.resize(specs.size());
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_UINT64, id.tensor_digests.data()), where, ": reading ", kDigestsAttr);
  const uint64_t fp = model_fingerprint(config_json, weight_dtype, specs, id.tensor_digests);
  LFM2_CHECK(fp == id.fingerprint, where, ": model_fingerprint ", text, " does not match the config and digests it",
             " stands for (", hex64(fp), "): a damaged file");
  return id;
}

}  // namespace lfm2
