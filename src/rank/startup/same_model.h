// At start-up, every rank's weight file must hold the same model: rank 0 gathers each rank's file
// path, model fingerprint (io/model_identity.h) and stage attributes, and fails with one line naming
// two files that differ ("stage-1.h5 (rank 1) holds another model than stage-0.h5 (rank 0) ...").
// Two seeds of one shape, or stage files of two models, are caught here instead of running to a
// wrong answer. Files of an older h5pack have no fingerprint: a stage file without one is an error
// (nothing proves where it was cut from), a whole-model file a warning (docs/pipeline.md).
#pragma once

#include <string>

#include "io/weight_file.h"
#include "rank/mpi/world.h"

namespace lfm2 {

// Collective: every rank calls it, `weights` null where this rank's file did not open. Throws on
// rank 0 only (the others' part is done when it returns). On success rank 0 logs the fingerprint.
void check_same_model(const WorldConfig& world, const WeightReader* weights, const std::string& path,
                      double timeout_s);

}  // namespace lfm2
