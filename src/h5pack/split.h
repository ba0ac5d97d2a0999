// `h5pack split`: one weight file per pipeline stage, each holding exactly what that stage reads
// (stage_tensor_specs), for nodes that share no filesystem.
#pragma once

#include <string>
#include <vector>

namespace lfm2 {

// `pattern` holds one "%d" (the stage index), e.g. "stage-%d.h5". `layers` ("6,6,6,6") overrides
// the balanced split of default_stages. All or nothing: every stage file is written under a
// temporary name and renamed into place only when all have been written. Returns the paths written.
std::vector<std::string> split_weights(const std::string& in, int n_stages, const std::string& pattern,
                                       const std::string& layers = "", bool progress = false);

// The pattern with "%d" replaced by `stage`; throws unless the pattern has exactly one "%d" and no other '%'.
std::string stage_path(const std::string& pattern, int stage);

}  // namespace lfm2
