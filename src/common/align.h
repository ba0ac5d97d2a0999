// Offsets in a workspace carved into pieces: each piece on a 256-byte boundary (what cudaMalloc
// returns; enough for 16-byte vector loads, cp.async and TMA rows).
#pragma once

#include <cstdint>

namespace lfm2 {

constexpr int64_t kWorkspaceAlign = 256;

constexpr int64_t align_up(int64_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

}  // namespace lfm2
