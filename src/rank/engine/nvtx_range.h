// NVTX ranges: host spans on the Nsight Systems timeline where the CUDA toolkit's NVTX 3 headers
// are available (LFM2_HAVE_NVTX); nothing elsewhere.
#pragma once

namespace lfm2 {

// A host span on the NVTX timeline (Nsight Systems) where NVTX is available; nothing elsewhere.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace lfm2
