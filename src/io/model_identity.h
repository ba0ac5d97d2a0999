// Model identity: a fingerprint of the whole model written into every weight and stage file.
//
// Each tensor's digest is XXH64 (seed 0) of its stored bytes, little-endian, row-major, as the file
// holds them (matrices in the weight dtype, vectors fp32). The model fingerprint is XXH64 of the text
//   "lfm2-rank model fingerprint 1\n" <weight_dtype> "\n" <config_json> "\n"
//   then for every tensor of the model in name-table order: <path> " " <digest, 16 hex> "\n"
// so it changes with the config, the stored dtype and any bit of any weight. A file stores it as the
// root attribute `model_fingerprint` (16 lowercase hex digits) beside `tensor_digests`, the uint64
// digests of every tensor of the whole model in name-table order; stage files carry the whole
// model's, so any file can be checked on its own (`h5pack verify`) and ranks holding stage files
// can prove they were cut from one model. Files from an older h5pack have neither attribute.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "io/weight_names.h"

namespace lfm2 {

struct ModelIdentity {
  uint64_t fingerprint = 0;
  std::vector<uint64_t> tensor_digests;  // model_tensor_specs order
};

uint64_t model_fingerprint(const std::string& config_json, DType weight_dtype, const std::vector<TensorSpec>& specs,
                           const std::vector<uint64_t>& digests);

// Writes both root attributes.
void write_model_identity(hid_t file, const ModelIdentity& id);

// Reads them when present (else nullopt); throws when they are malformed or do not agree with each
// other (a damaged file). `specs` is the model's name table.
std::optional<ModelIdentity> read_model_identity(hid_t file, const std::string& where, const std::string& config_json,
                                                 DType weight_dtype, const std::vector<TensorSpec>& specs);

}  // namespace lfm2
