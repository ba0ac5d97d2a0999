// A stage's weights on the GPU (SPEC §1), named as LayerWeights and ModelWeights name them
// (model/layer_weights.h), in one device allocation. The datasets that one GEMM reads together are
// stacked into one matrix: qkv_proj is q_proj; k_proj; v_proj, w13 is w1; w3, and experts_w13 holds
// each expert's w1 rows then its w3 rows. Matrices are in the compute dtype T (an FP8 file's experts
// in e4m3 on 16-bit stages); norms, the expert bias, conv taps and the RoPE frequencies stay fp32.
// Uploaded straight from the file, each dataset named by the name table (io/weight_names.h), by
// model/weight_upload.h.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "io/weight_file.h"
#include "model/cuda_memory.h"
#include "model/stage_executor.h"

namespace lfm2 {

// One decoder layer's device pointers; members a layer kind does not use stay null.
template <typename T>
struct DeviceLayerWeights {
  int il = -1;
  bool is_attention = false, is_moe = false;

  const float* operator_norm = nullptr;  // (H)
  const float* ffn_norm = nullptr;       // (H)

  // attention layers
  const T* qkv_proj = nullptr;         // ((nh + 2 nkv) hd, H): q_proj; k_proj; v_proj
  const T* out_proj = nullptr;         // (H, nh hd)
  const float* q_layernorm = nullptr;  // (hd)
  const float* k_layernorm = nullptr;  // (hd)

  // short-conv layers
  const float* conv = nullptr;      // (H, L)
  const T* conv_in_proj = nullptr;  // (3H, H)
  const T* conv_out_proj = nullptr; // (H, H)

  // dense FFN layers
  const T* w13 = nullptr;  // (2I, H): w1; w3
  const T* w2 = nullptr;   // (H, I)

  // MoE layers
  const T* gate = nullptr;             // (E, H)
  const float* expert_bias = nullptr;  // (E), null when the file has none
  const T* experts_w13 = nullptr;      // (E, 2Im, H): per expert its w1 rows, then its w3 rows
  const T* experts_w2 = nullptr;       // (E, H, Im)
  // The same experts of an FP8 file on a 16-bit stage (an fp32 stage, and a file's other quantized
  // matrices, are dequantized at upload): e4m3 with their fp32 scales (w1's then w3's per expert,
  // under the file's cfg.fp8.scheme; docs/fp8.md), and experts_w13 / experts_w2 null.
  const uint8_t* experts_w13_q = nullptr;
  const float* experts_w13_s = nullptr;
  const uint8_t* experts_w2_q = nullptr;
  const float* experts_w2_s = nullptr;
  // With hidden and inter multiples of 128: the same scales per expert k-block major, as the
  // prompt rows' FP8 grouped GEMM reads them (kernels/cuda/grouped_gemm_fp8.h): block128 the blocks
  // transposed (w13: (H / 128, 2 Im / 128)), channel each row's scale repeated per 128 columns
  // (w13: (H / 128, 2 Im)); else null.
  const float* experts_w13_st = nullptr;
  const float* experts_w2_st = nullptr;

  // A --dense FP8 file's projections on a 16-bit stage (fp8_projections_on_device): e4m3 as
  // stored, stacked as the T members are (qkv: q; k; v rows, w13: w1; w3), with the file's scales
  // stacked alike (channel: (rows), block128: (rows / 128, cols / 128)); the T members hold their
  // dequantized copy too. The prompt rows run the e4m3 ones on cuBLASLt's FP8 matmul, the decode rows
  // the T copy on linear_decode (model/cuda_layers.h). Else null.
  const uint8_t *qkv_proj_q = nullptr, *out_proj_q = nullptr, *conv_in_proj_q = nullptr;
  const uint8_t *conv_out_proj_q = nullptr, *w13_q = nullptr, *w2_q = nullptr;
  const float *qkv_proj_s = nullptr, *out_proj_s = nullptr, *conv_in_proj_s = nullptr;
  const float *conv_out_proj_s = nullptr, *w13_s = nullptr, *w2_s = nullptr;
  // With LFM2_FP8_PROJ_GEMM=cutlass (the prompt rows on the experts' CUTLASS FP8 kernel as one
  // group, to compare; every part whole 128-row blocks): their scales k-block major as
  // experts_w13_st; else null.
  const float *qkv_proj_st = nullptr, *out_proj_st = nullptr, *conv_in_proj_st = nullptr;
  const float *conv_out_proj_st = nullptr, *w13_st = nullptr, *w2_st = nullptr;
};

// Whether LFM2_FP8_PROJ_GEMM=cutlass asks the CUTLASS kernel for the e4m3 projections' prompt rows.
bool fp8_projections_on_cutlass();

// Whether a 16-bit stage keeps a --dense FP8 file's projections in e4m3 (above) beside the
// dequantized T copy: by default for a file that says "projections" where every product's input
// width is a multiple of 128 (block128: every stacked part's rows too); LFM2_FP8_PROJ=0 keeps the
// T copy alone (every row on the 16-bit products, as before: docs/fp8.md).
bool fp8_projections_on_device(const ModelConfig& cfg, size_t elem_bytes);

// The stage's layers plus the embedding (first stage, or last when tied), the final norm and the
// head (last stage), and the RoPE inverse frequencies (cpu::rope_inv_freq).
template <typename T>
class DeviceWeights {
 public:
  // Reads exactly the datasets stage_tensor_specs() lists for the stage onto `device`.
  void upload(WeightReader& reader, const StageLayers& stage, int device);
  void release() { memory_.release(); }
  int64_t bytes() const { return memory_.bytes(); }

  std::vector<DeviceLayerWeights<T>> layers;  // the stage's layers, in order
  const T* embed_tokens = nullptr;            // (V, H)
  const float* embedding_norm = nullptr;      // (H)
  const T* lm_head = nullptr;                 // (V, H): untied heads only
  const float* rope_inv_freq = nullptr;       // (hd / 2)
  // The LM head matrix (V, H): lm_head, or embed_tokens when tied.
  const T* head_matrix() const { return tied_ ? embed_tokens : lm_head; }

 private:
  DeviceBlocks memory_;
  bool tied_ = false;
};

}  // namespace lfm2
