#include "rank/startup/plan_lines.h"

#include <algorithm>
#include <set>

#include "common/log.h"
#include "rank/engine/schedule_chart.h"
#include "rank/mpi/world.h"
#include "rank/report/run_report.h"

namespace lfm2 {
namespace {

// "plan: replica 1: ranks 3-5 on node-b, sequences 6-11 (6 x 9 tokens in 3 microbatches of 2,
// GPipe bubble 40.0%)", one line per replica, after one line on the grouping; none for one replica.
std::vector<std::string> replica_plan_lines(const ReplicaLayout& layout, const std::vector<ReplicaWork>& work,
                                            const std::vector<std::string>& hosts) {
  if (layout.n_replicas == 1) return {};
  std::set<std::string> nodes(hosts.begin(), hosts.end());
  std::vector<std::string> lines{cat("plan: ", layout.n_replicas, " replicas x ", layout.n_stages, " stages over ",
                                     layout.n_ranks(), " ranks on ", nodes.size(),
                                     nodes.size() == 1 ? " node" : " nodes", " (--pipeline ", layout.n_stages,
                                     "); sequences in contiguous blocks by tokens")};
  for (int r = 0; r < layout.n_replicas; ++r) {
    const ReplicaWork& w = work[size_t(r)];
    std::vector<std::string> seen;
    std::string on;
    for (int rank : layout.ranks[size_t(r)]) {
      const std::string& h = hosts[size_t(rank)];
      if (std::find(seen.begin(), seen.end(), h) != seen.end()) continue;
      seen.push_back(h);
      on += (on.empty() ? "" : " + ") + h;
    }
    lines.push_back(cat("plan: replica ", r, ": ", layout.rank_list(r), " on ", on, ", ", w.seqs.name(), " (",
                        w.seqs.size(), " x ", w.width, " tokens in ", w.n_micro(), " microbatches of ", w.microbatch,
                        ", GPipe bubble ", fixed(100 * gpipe_bubble(layout.n_stages, w.n_micro()), 1), "%)"));
  }
  return lines;
}

}  // namespace

std::vector<RankFacts> gather_facts(const WorldConfig& world, const RankFacts& mine, double timeout_s) {
  std::vector<RankFacts> all(size_t(world.size));
  constexpr int kN = sizeof(RankFacts) / sizeof(int64_t);
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&mine, kN, MPI_INT64_T, all.data(), kN, MPI_INT64_T, 0, world.comm, &req),
            "gathering the plan");
  wait_mpi_request(&req, timeout_s, "gathering the plan");
  return all;
}

std::string generation_line(const RankOptions& opt) {
  std::string ids;
  for (int64_t e : opt.eos) ids += (ids.empty() ? "" : ", ") + std::to_string(e);
  const std::string eos = opt.eos_off        ? "no EOS (--eos none)"
                          : opt.eos.empty()  ? "no EOS (neither --eos nor the model's generation_config names one)"
                                             : cat("EOS ", ids, " (", opt.eos_source, ")");
  return cat("generation: up to ", opt.max_new_tokens, " new tokens a sequence (",
             opt.max_new_default ? "the default of --prompts" : "--max-new-tokens",
             "; per-request max_tokens where the inputs set them), ", eos);
}

PlanText plan_text(const RankOptions& opt, bool stage_files, bool use_cuda, int n_threads, const char* transport) {
  PlanText t;
  t.how = !opt.layers.empty() ? "--layers " + opt.layers
          : stage_files      ? std::string("as the stage files were split")
          : use_cuda         ? std::string("balanced by the GPU cost model")
                             : std::string("balanced by FLOPs");
  t.backend = use_cuda ? cat("cuda ", opt.dtype, opt.dtype != "fp32" ? "" : opt.tf32 ? " (TF32)" : " (TF32 off)",
                             ", CUDA graphs ", opt.cuda_graphs ? "on" : "off")
                       : cat("cpu fp32, threads per rank ", n_threads);
  t.transport = transport;
  return t;
}

void print_plan(const RankSetup& s, const PlanText& t, const std::vector<RankFacts>& all,
                const std::vector<GpuFacts>& gpus, const std::vector<std::string>& hosts) {
  const ReplicaLayout& l = s.layout;
  const int P = l.n_stages;
  const int64_t M = s.work[0].n_micro();
  if (l.n_replicas == 1)
    log_info(cat("plan: ", P, " ranks over ", s.cfg.num_hidden_layers, " layers (", t.how, "); ", s.n_seq, " x ",
                 s.seq_len, " tokens in ", M, " microbatches of ", s.microbatch, " (GPipe bubble ",
                 fixed(100 * gpipe_bubble(P, M), 1), "%); ", t.backend, ", transport ", t.transport));
  else
    log_info(cat("plan: ", P, " stages over ", s.cfg.num_hidden_layers, " layers in each of ", l.n_replicas,
                 " replicas (", t.how, "); ", s.n_seq, " x ", s.seq_len, " tokens; ", t.backend, ", transport ",
                 t.transport));
  for (const std::string& line : replica_plan_lines(l, s.work, hosts)) log_info(line);
  for (int r = 0; r < l.n_ranks(); ++r) {
    const RankFacts& f = all[size_t(r)];
    const std::string where = l.n_replicas == 1 ? cat("local ", f.local_rank)
                                                : cat("replica ", l.replica_of[size_t(r)], " stage ",
                                                      l.stage_of[size_t(r)], ", local ", f.local_rank);
    log_info(cat("plan: rank ", r, " (", where, "): layers ", f.layer_begin, "-", f.layer_end - 1, " (",
                 f.layer_end - f.layer_begin, "), weights ", mib(f.weight_bytes), ", read ", mib(f.bytes_read),
                 ", free host memory ", f.free_host < 0 ? std::string("?") : gib(f.free_host),
                 f.gpu < 0 ? std::string()
                           : cat("; GPU ", f.gpu, " ", gpus[size_t(r)].name, " (", gpus[size_t(r)].uuid_text, ") on ",
                                 gpus[size_t(r)].host, ": weights ", gib(f.gpu_weight_bytes), ", free ",
                                 gib(f.gpu_free), " of ", gib(f.gpu_total))));
  }
  for (int rep = 0; rep < l.n_replicas; ++rep) {
    const int64_t m = s.work[size_t(rep)].n_micro();
    if (m < P)
      log_info(cat("warning: ", m, " microbatches for ", P, l.n_replicas == 1 ? " ranks" : " stages",
                   l.n_replicas == 1 ? std::string() : cat(" in replica ", rep), ": some ranks will idle (bubble ",
                   int(100 * gpipe_bubble(P, m)), "%); use a smaller --microbatch"));
  }
}

}  // namespace lfm2
