// The shipped default: lfm2-rank with no --model and no --inputs runs the model, inputs and
// answers named by data/default/recipe.json (./data/default, else the installed
// P/share/lfm2-rank/data/default, else the source tree's); its model is generated into the cache
// (${LFM2_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/lfm2-rank}/default/, launch/local.sh does it once).
#pragma once

#include "rank/options.h"

namespace lfm2 {

// Fills in the default's paths (answers only where none were given) and, when its model is
// missing, fails with the h5pack command that creates it.
void resolve_default(RankOptions& opt);

}  // namespace lfm2
