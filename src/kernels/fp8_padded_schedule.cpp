// Which tile scheduler the padded FP8 expert products run (grouped_gemm_fp8.h): the counter's
// (padded_dynamic_scheduler_sm90.cuh, the default) or CUTLASS's static stride. In lfm2_kernels_cutlass
// beside the products, which read it at every launch.
#include "common/env.h"
#include "kernels/cuda/grouped_gemm_fp8.h"

namespace lfm2::cuda::grouped {

bool fp8_padded_dynamic_from_env() {
  return env_choice("LFM2_FP8_PADDED_SCHED", "dynamic", {"dynamic", "static"}) == "dynamic";
}

namespace {

bool& padded_dynamic() {
  static bool on = fp8_padded_dynamic_from_env();
  return on;
}

}  // namespace

void set_fp8_padded_dynamic(bool on) { padded_dynamic() = on; }
bool fp8_padded_dynamic() { return padded_dynamic(); }

}  // namespace lfm2::cuda::grouped
