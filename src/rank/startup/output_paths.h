// lfm2-rank's outputs, checked at start-up by the rank that writes each (--trace, --metrics, the
// encoded --prompts: rank 0; --output, --results: the last rank, rank 0 in a continuous generation),
// before any work: the path is no directory, a file can be created in its directory, and it is none
// of the run's inputs (every rank's weight file as this node sees it, --inputs, --answers) nor another
// output (common/output_guard.h); a continuous generation's journal and partial file beside --output
// count as outputs. Replacing an existing file is said in the log.
#pragma once

#include <functional>
#include <string>

#include "rank/mpi/world.h"
#include "rank/options.h"

namespace lfm2 {

// `weight_path(s)`: the weight file of stage s of n_stages (the --model pattern filled in; with
// replicas every replica's stage s reads it).
void check_run_outputs(const RankOptions& opt, const WorldConfig& world, int n_stages,
                       const std::function<std::string(int)>& weight_path);

}  // namespace lfm2
