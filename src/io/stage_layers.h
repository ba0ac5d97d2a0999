// A pipeline stage's layers, the one type for them in the whole project: stage `stage` of
// `n_stages` runs the contiguous layers [layer_begin, layer_end). The layer partition makes them
// (plan/layer_partition.h), a stage file records its own (weight_file.h), the name table lists
// their tensors (weight_names.h), and an executor loads and runs one (model/).
#pragma once

namespace lfm2 {

struct StageLayers {
  StageLayers() = default;
  StageLayers(int stage_, int n_stages_, int begin, int end)
      : stage(stage_), n_stages(n_stages_), layer_begin(begin), layer_end(end) {}
  // The former {layer_begin, layer_end, is_first, is_last} would otherwise compile to another stage.
  StageLayers(int, int, bool, bool) = delete;

  int stage = 0, n_stages = 1;
  int layer_begin = 0, layer_end = 0;  // [begin, end)

  bool is_first() const { return stage == 0; }               // embeds the tokens
  bool is_last() const { return stage == n_stages - 1; }     // applies the head
  int n_layers() const { return layer_end - layer_begin; }
  bool operator==(const StageLayers& o) const {
    return stage == o.stage && n_stages == o.n_stages && layer_begin == o.layer_begin && layer_end == o.layer_end;
  }
};

// All n_layers layers as the one stage of a one-stage pipeline.
inline StageLayers whole_model(int n_layers) { return {0, 1, 0, n_layers}; }

}  // namespace lfm2
