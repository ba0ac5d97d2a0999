// The text front end (tools/lfm2_text.py, docs/text.md) run as a subprocess: --prompts encoded into
// the inputs file before start-up (rank 0), the outputs decoded into --results after they are written
// (the rank that writes them). A front end that fails says one line, which becomes the runner's error.
#pragma once

#include <string>
#include <vector>

#include "rank/options.h"

namespace lfm2 {

// --prompts P --results R: the files the run derives from R ("out.jsonl" -> "out.inputs.h5" and,
// without --output, "out.outputs.h5"), kept beside it (a second look, --resume, decode again).
std::string derived_path(const std::string& results, const std::string& suffix);

// The interpreter ($LFM2_PYTHON, else python3) and the script ($LFM2_TEXT_TOOL, else the installed
// P/share/lfm2-rank/tools/lfm2_text.py beside this program, else the source tree's tools/).
std::vector<std::string> front_end_command();

// Runs the front end with `args` (encode ... / decode ...) within `timeout_s`. Its last line on
// stdout is returned; a failure throws with its error line ("lfm2_text: error: " dropped), a
// front end that cannot start or outlives the timeout (then killed) throws saying so.
std::string run_front_end(const std::vector<std::string>& args, double timeout_s);

// rank 0 before start-up: opt.prompts -> opt.inputs (encode) with the text side of `model_file`
// (the model, or stage 0's file: h5pack split copies the text side into every stage file).
void encode_prompts(const RankOptions& opt, const std::string& model_file);
// After the output is written: opt.output -> opt.results (decode, with the inputs and the run's EOS
// ids, none when it had none); returns the front end's line ("lfm2_text: wrote ...").
std::string decode_results(const RankOptions& opt, const std::string& model_file);

}  // namespace lfm2
