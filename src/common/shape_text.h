// A tensor's shape as error messages print it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lfm2 {

// "(2048, 64)", as h5py and numpy print a dataset's shape (one dimension: "(8,)"): HDF5 files.
inline std::string shape_tuple(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// "[2048, 64]", as safetensors headers and config.json write it: checkpoints.
inline std::string shape_list(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace lfm2
