// `h5pack inspect`: reads a weight file's attributes and dataset metadata (never its data).
#include "h5pack/inspect.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/xxhash64.h"
#include "io/weight_file.h"
#include "plan/layer_partition.h"

namespace lfm2 {

namespace {
// n with a decimal prefix: "8.34 B", "16.68 GB"; `units` names 1e9, 1e6, 1e3 and 1 in that order.
std::string with_prefix(int64_t n, const char* const (&units)[4]) {
  char buf[32];
  const double v = double(n);
  const double scale[3] = {1e9, 1e6, 1e3};
  for (int i = 0; i < 3; ++i)
    if (v >= scale[i]) {
      std::snprintf(buf, sizeof buf, "%.2f%s", v / scale[i], units[i]);
      return buf;
    }
  std::snprintf(buf, sizeof buf, "%lld%s", static_cast<long long>(n), units[3]);
  return buf;
}
}  // namespace

std::string human_count(int64_t n) { return with_prefix(n, {" B", " M", " K", ""}); }

std::string human_bytes(int64_t n) { return with_prefix(n, {" GB", " MB", " kB", " B"}); }

InspectReport inspect_weights(const std::string& path, int n_stages) {
  WeightReader reader(path);
  InspectReport r;
  r.path = path;
  r.config = reader.config();
  r.weight_dtype = reader.weight_dtype();
  r.is_stage_file = reader.is_stage_file();
  if (reader.identity()) r.fingerprint = hex64(reader.identity()->fingerprint);
  if (r.is_stage_file) {
    r.stage = reader.stage().stage;
    r.n_stages = reader.stage().n_stages;
    r.layer_begin = reader.stage().layer_begin;
    r.layer_end = reader.stage().layer_end;
  }
  r.model_params = r.config.total_params();
  for (const auto& spec : model_tensor_specs(r.config)) {
    if (!reader.has(spec.path)) continue;
    InspectDataset d;
    d.path = spec.path;
    d.shape = reader.shape(spec.path);
    d.dtype = reader.dtype(spec.path);
    d.bytes = reader.storage_bytes(spec.path);
    H5Handle dset(H5Dopen2(reader.file(), spec.path.c_str(), H5P_DEFAULT));
    H5_CHECK(dset.get(), path, ": opening dataset ", spec.path);
    haddr_t off = H5Dget_offset(dset.get());
    d.offset = off == HADDR_UNDEF ? -1 : int64_t(off);
    int64_t n = 1;
    for (auto x : d.shape) n *= x;
    r.file_params += n;
    r.file_bytes += d.bytes;
    r.datasets.push_back(std::move(d));
  }
  LFM2_CHECK(n_stages >= 0, path, ": --stages ", n_stages, " must be positive");
  if (n_stages > 0) {
    LFM2_CHECK(n_stages <= r.config.num_hidden_layers, path, ": cannot split ", r.config.num_hidden_layers,
               " layers into ", n_stages, " stages");
    for (const auto& plan : default_stage_plans(r.config, n_stages)) {
      InspectStage s{plan.rank, plan.layer_begin, plan.layer_end, 0, 0, -1, -1};
      bool all_present = true;
      int64_t lo = INT64_MAX, hi = 0;
      for (const auto& spec : stage_tensor_specs(r.config, plan.layer_begin, plan.layer_end, plan.is_first(),
                                                 plan.is_last())) {
        s.params += spec.numel();
        const DType t = spec.is_vector() ? DType::F32 : r.weight_dtype;
        s.bytes += spec.numel() * int64_t(dtype_size(t));
        auto it = std::find_if(r.datasets.begin(), r.datasets.end(),
                               [&](const InspectDataset& d) { return d.path == spec.path; });
        if (it == r.datasets.end() || it->offset < 0) {
          all_present = false;
          continue;
        }
        // The tied embedding of the last stage sits at the file's start: count the layer range only.
        if (spec.path == names::kEmbedTokens && !plan.is_first()) continue;
        lo = std::min(lo, it->offset);
        hi = std::max(hi, it->offset + it->bytes);
      }
      if (all_present) {
        s.file_begin = lo;
        s.file_end = hi;
      }
      r.stages.push_back(s);
    }
  }
  return r;
}

std::string format_report(const InspectReport& r, bool brief) {
  std::ostringstream os;
  const ModelConfig& c = r.config;
  os << r.path << ": lfm2-rank weight file, weights " << dtype_name(r.weight_dtype) << " (vectors fp32)\n";
  if (r.is_stage_file)
    os << "stage file: stage " << r.stage << " of " << r.n_stages << ", layers " << r.layer_begin << ".."
       << r.layer_end - 1 << "\n";
  os << "model fingerprint: "
     << (r.fingerprint.empty() ? std::string("none (written by an older h5pack)")
                               : r.fingerprint + " (config and every tensor; h5pack verify checks the data)")
     << "\n";
  std::string attn;
  for (int il = 0; il < c.num_hidden_layers; ++il)
    if (c.is_attention(il)) attn += (attn.empty() ? "" : ",") + std::to_string(il);
  os << "config: vocab " << c.vocab_size << ", hidden " << c.hidden_size << ", layers " << c.num_hidden_layers
     << " (attention at " << attn << "), heads " << c.num_attention_heads << "/" << c.num_key_value_heads
     << " kv, head_dim " << c.head_dim() << ", dense layers " << c.num_dense_layers << " (intermediate "
     << c.intermediate_size << "), experts " << c.num_experts << " top-" << c.num_experts_per_tok
     << " (intermediate " << c.moe_intermediate_size << "), rope_theta " << c.rope_theta << ", norm_eps "
     << c.norm_eps << ", " << (c.tie_word_embeddings ? "tied" : "untied") << " head\n";
  if (!brief) {
    os << "datasets (" << r.datasets.size() << "):\n";
    for (const auto& d : r.datasets) {
      std::string shape = "(";
      for (size_t i = 0; i < d.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(d.shape[i]);
      shape += ")";
      char line[256];
      std::snprintf(line, sizeof line, "  %-34s %-20s %-5s %12lld bytes at %lld\n", d.path.c_str(), shape.c_str(),
                    dtype_name(d.dtype), static_cast<long long>(d.bytes), static_cast<long long>(d.offset));
      os << line;
    }
  } else {
    os << "datasets: " << r.datasets.size() << "\n";
  }
  os << "parameters: " << human_count(r.file_params) << " (" << r.file_params << ") in this file";
  if (r.file_params != r.model_params) os << ", " << human_count(r.model_params) << " (" << r.model_params << ") in the model";
  os << "\n";
  os << "data bytes: " << human_bytes(r.file_bytes) << " (" << r.file_bytes << ")\n";
  if (!r.stages.empty()) {
    os << "stages (" << r.stages.size() << ", balanced split):\n";
    for (const auto& s : r.stages) {
      os << "  stage " << s.stage << ": layers " << s.layer_begin << ".." << s.layer_end - 1 << ", "
         << human_count(s.params) << " parameters, reads " << human_bytes(s.bytes) << " (" << s.bytes << " bytes)";
      if (s.file_begin >= 0) os << ", file bytes [" << s.file_begin << ", " << s.file_end << ")";
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace lfm2
