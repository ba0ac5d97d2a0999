// Start-up's checks of the options against the model and the machine, and the small facts they
// read: which file each rank opens, the layers of each stage, the threads of a rank, free memory.
// Each throws lfm2::Error with one line naming what is wrong and how to mend it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/weight_file.h"
#include "model/stage_executor.h"
#include "plan/layer_partition.h"
#include "rank/jobs/generate_job.h"
#include "rank/mpi/world.h"
#include "rank/options.h"

namespace lfm2 {

// "stage-%d.h5" -> "stage-2.h5" for stage 2; any other path is the whole-model file.
std::string weight_path_for(const std::string& model, int stage);

// The layers of each of P stages: --layers, the split a stage file was cut with (h5pack split's
// default plan: seq_len 32, last-position head), or a split balanced for this run's sequence length.
std::vector<StageLayers> plan_stages(const RankOptions& opt, const ModelConfig& cfg, bool stage_files, int P, int64_t S,
                                   bool use_cuda);

// A stage file holds the stage this rank runs, with the layers this plan gives it.
void check_stage_file(const StageLayers& s, const std::string& path, const StageLayers& plan, const WorldConfig& world,
                      const WorldConfig& pipe, int n_replicas, const RankOptions& opt);

// Generation's options against the model (every rank checks; rank 0 reports).
void check_generation(const RankOptions& opt, const ModelConfig& cfg, int64_t seq_len);

// --results with --inputs (no --prompts): what tools/lfm2_text.py decode needs after the run, before
// any work: the model's tokenizer, an inputs file made by its encode, and with the same tokenizer.
void check_results_inputs(const RankOptions& opt);

// The generation state of this stage must fit in the memory it lives in, checked before any work.
void check_state_fits(const StageExecutor& exec, const GenerateShape& shape, bool on_gpu);

// Threads per rank: the cores this rank is bound to, or, when the launcher did not bind it, the
// node's cores shared among the node's ranks.
int default_threads(const WorldConfig& world);

// MemAvailable of /proc/meminfo in bytes; -1 where unknown.
int64_t free_host_bytes();

}  // namespace lfm2
