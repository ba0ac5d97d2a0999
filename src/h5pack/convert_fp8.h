// `h5pack convert DIR OUT --dtype fp8 [--scheme channel|block128] [--dense]`: a Hugging Face
// checkpoint straight to an FP8 weight file (docs/fp8.md). Two passes through a temporary file
// beside OUT (`convert` in the checkpoint's dtype, then `quantize`), so the bits are exactly those of
// running the two commands; the temporary (as large as the bf16 model) is removed when the command
// ends, however it ends (an error, Ctrl-C; a SIGKILL's is removed by the next run). A checkpoint
// that is FP8 already (published `weight_scale_inv` scales) converts directly, its scales kept.
#pragma once

#include <string>

#include "h5pack/quantize.h"

namespace lfm2 {

// opt.progress: progress lines for both passes. `scheme_given`: --scheme or --dense was on the
// command line (refused for a checkpoint that is FP8 already: its own scales decide).
void convert_checkpoint_fp8(const std::string& dir, const std::string& out, const QuantizeOptions& opt,
                            bool scheme_given);

}  // namespace lfm2
