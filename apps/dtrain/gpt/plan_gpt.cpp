// The GPT's planner inputs; see plan_gpt.h.
#include "apps/dtrain/gpt/plan_gpt.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "apps/dtrain/gpt/text_data.h"
#include "comm/factory.h"
#include "comm/gather_text.h"
#include "core/error.h"
#include "dispatch/tensor_memory.h"
#include "models/gpt.h"
#include "parallel/meta_device.h"
#include "plan/comm_benchmark.h"
#include "plan/measure_compute.h"
#include "plan/overlap_benchmark.h"
#include "plan/plan_report.h"
#include "plan/step_model.h"

namespace dtrain::train {

namespace {

models::GPTConfig run_config(const TrainOptions& o) {
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;  // bytes
  cfg.seed = o.seed;
  return cfg;
}

std::string describe(const models::GPTConfig& c) {
  return str_cat("GPT ", c.n_layer, "x", c.n_embd, ", ", c.n_head, " heads, seq ", c.block_size, ", vocab ",
                 c.vocab_size);
}

// The degrees the GPT's plan allows: dividing the world, the heads and the byte vocabulary.
std::vector<int64_t> tp_degrees(const models::GPTConfig& c, int64_t world) {
  std::vector<int64_t> out;
  for (int64_t t = 2; t <= world; ++t) {
    if (world % t == 0 && c.n_head % t == 0 && c.vocab_size % t == 0) out.push_back(t);
  }
  return out;
}

double meminfo_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::atof(line.c_str() + 13) * 1024.0;
  }
  return 0;
}

// The links: --profile FILE, builtin, or the cache; measured on the live ranks when missing.
plan::ClusterProfile links_for(const TrainOptions& o, const PlanContext& ctx, bool* measured_now) {
  *measured_now = false;
  if (o.profile == "builtin") return plan::built_in_cluster_profile();
  if (!o.profile.empty()) return plan::read_cluster_profile(o.profile);
  plan::ClusterProfile none;
  if (ctx.world == 1) {
    none.source = "one rank: no communication";
    return none;
  }
  const std::string path = str_cat(plan::default_cache_dir(), "/comm-", ctx.backend, "-", ctx.world, "ranks-",
                                   ctx.ranks_per_host, "perhost.json");
  const bool lead = !ctx.group || ctx.group->group_rank() == 0;
  if (ctx.group) {  // every rank must take the same branch: rank 0's view of the cache decides
    const std::vector<std::string> seen =
        comm::all_gather_text(ctx.group, std::filesystem::exists(path) ? "cached" : "missing");
    if (seen[0] == "cached") return plan::read_cluster_profile(path);
  } else if (std::filesystem::exists(path)) {
    return plan::read_cluster_profile(path);
  }
  if (!ctx.group || ctx.group->group_size() != ctx.world) {
    throw ValueError(str_cat(
        "plan: no profile of the ", ctx.backend, " links at ", ctx.world, " ranks (", ctx.ranks_per_host,
        " per host) is cached at ", path, ". Measure one with `dtrain run -n ", ctx.world,
        " -- dtrain bench comm --profile FILE` and pass --profile FILE, run the plan inside `dtrain run -n ",
        ctx.world, "` (it measures and caches one), or pass --profile builtin for built-in figures."));
  }
  plan::CommBenchOptions bo;
  bo.ops = {"all_reduce", "all_gather", "reduce_scatter"};
  bo.min_bytes = 4 << 10;
  bo.max_bytes = 4 << 20;
  bo.step_factor = 8;
  plan::ClusterProfile p;
  p.backend = ctx.group->name();
  p.source = "measured by dtrain on these ranks (a short sweep, cached)";
  const bool across = ctx.ranks_per_host < ctx.world;
  plan::LinkProfile& links = across ? p.inter_host : p.intra_host;
  links.ranks = static_cast<int>(ctx.world);
  links.collectives = plan::run_comm_benchmark(*ctx.group, bo, [](const plan::CommBenchRow&) {}).collectives;
  if (across) {  // each host's ranks at once (consecutive ranks share a host), each host's own links
    const int rank = ctx.group->group_rank(), per = static_cast<int>(ctx.ranks_per_host);
    const comm::BackendPtr host = ctx.group->split(rank / per, rank % per);
    p.intra_host.ranks = per;
    if (per > 1) {
      p.intra_host.collectives =
          plan::run_comm_benchmark(*host, bo, [](const plan::CommBenchRow&) {}).collectives;
    }
    p.overlap = plan::measure_overlap(per > 1 ? *host : *ctx.group);
  } else {
    p.overlap = plan::measure_overlap(*ctx.group);
  }
  *measured_now = true;
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(plan::default_cache_dir(), ec);
    plan::write_cluster_profile(path, p);
  }
  p.path = path;
  return p;
}

}  // namespace

GptPlan plan_gpt(const TrainOptions& o, const PlanContext& ctx) {
  const models::GPTConfig cfg = run_config(o);
  cfg.validate();
  GptPlan out;
  const parallel::TensorParallelPlan tp_plan = gpt_tensor_parallel_plan(cfg, false);
  const std::vector<int64_t> degrees = tp_degrees(cfg, ctx.world);
  const TextCorpus loaded = ctx.corpus ? TextCorpus{} : load_text(o.data);
  const TextCorpus& corpus = ctx.corpus ? *ctx.corpus : loaded;
  const int64_t data_bytes =
      corpus.train.numel() * corpus.train.element_size() + corpus.val.numel() * corpus.val.element_size();
  {
    models::GPT meta{nullptr};
    {
      parallel::OnMetaDevice on_meta;
      meta = models::GPT(cfg);
    }
    out.facts =
        plan::model_facts(*meta, tp_plan, degrees, /*can_checkpoint=*/true, data_bytes, describe(cfg));
  }
  out.facts.shape =
      plan::TransformerShape{cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab_size, 4};
  bool links_measured = false;
  plan::ClusterProfile links = links_for(o, ctx, &links_measured);

  plan::ProfileTarget target;
  target.description = describe(cfg);
  target.build = [cfg] { return std::static_pointer_cast<torch::nn::Module>(models::GPT(cfg).ptr()); };
  const int64_t T = cfg.block_size;
  target.loss = [T](torch::nn::Module& m, int64_t mb) {
    auto& gpt = dynamic_cast<models::GPTImpl&>(m);
    const at::Tensor w = at::randint(256, {mb, T + 1}, at::kLong);
    return gpt.loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
  };
  target.checkpoint_patterns = {"h*"};
  target.tp_plan = [cfg](bool sp) { return gpt_tensor_parallel_plan(cfg, sp); };
  if (links_measured && !degrees.empty()) {
    // the cost of a blocking collective in this model's step, on the real ranks (cached with the links)
    const int64_t t = degrees.back();
    const comm::BackendPtr tp_group =
        t == ctx.world
            ? ctx.group
            : ctx.group->split(static_cast<int>(ctx.group->group_rank() / t), ctx.group->group_rank());
    links.blocking_penalty_s = plan::measure_blocking_penalty(
        target, tp_group, std::max<int64_t>(1, o.batch * t / ctx.world / 2), links);
    if (ctx.group->group_rank() == 0) plan::write_cluster_profile(links.path, links);
  }
  std::unique_ptr<plan::ComputeModel> compute;
  if (links.flops_per_s > 0) {
    compute = plan::analytic_compute(*out.facts.shape, links.flops_per_s, links.optimizer_s_per_param);
  } else {
    plan::MeasureOptions mo;
    mo.largest_micro_batch.clear();
    mo.largest_micro_batch.emplace_back(1, std::max<int64_t>(1, o.batch / ctx.world));
    for (int64_t t : degrees)
      mo.largest_micro_batch.emplace_back(t, std::max<int64_t>(1, o.batch * t / ctx.world));
    mo.smallest_micro_batch = std::max<int64_t>(1, o.batch / (8 * ctx.world));  // (accumulation up to 8)
    if (ctx.world > 1) {  // the data-parallel strategies rehearsed over the world (tp 1)
      const int64_t mb = std::max<int64_t>(1, o.batch / ctx.world / 4);
      const int64_t buckets = o.bucket_bytes > 0 ? o.bucket_bytes : plan::default_bucket_bytes();
      for (bool ckpt : {false, true}) {
        for (int64_t acc : {1, 2}) {
          for (const char* s : {"dp", "zero1", "zero2"})
            mo.rehearsals.push_back({s, ctx.world, buckets, ckpt, acc, mb});
          for (int64_t u : plan::zero3_unit_sizes(out.facts, 1)) {
            mo.rehearsals.push_back({"zero3", ctx.world, u, ckpt, acc, mb});
          }
        }
      }
    }
    const int threads_before = at::get_num_threads();
    if (!ctx.group) {  // as a rank of that world would run: the host's cores shared by its ranks
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      at::set_num_threads(std::max(1, cores / static_cast<int>(std::max<int64_t>(1, ctx.ranks_per_host))));
    }
    bool measured = false;
    const std::string dir = plan::default_cache_dir();
    plan::ComputeProfile profile = plan::cached_compute_profile(target, mo, dir, &measured);
    at::set_num_threads(threads_before);
    compute = plan::measured_compute(std::move(profile),
                                     measured ? "measured now, cached in " + dir : "cached in " + dir);
  }

  plan::PlanRequest r;
  r.topo = {ctx.world, ctx.ranks_per_host};
  r.batch = o.batch;
  if (o.memory_budget > 0) {
    r.memory_budget = static_cast<double>(o.memory_budget);
    r.budget_source = str_cat("--memory-budget ", o.memory_budget);
  } else if (links.flops_per_s > 0 && links.memory_bytes > 0) {
    r.memory_budget = links.memory_bytes;
    r.budget_source = str_cat("the memory_bytes of ", links.path);
  } else {
    const double free = meminfo_available() / static_cast<double>(ctx.ranks_per_host);
    const double runtime =
        process_memory_mib("VmRSS") * (1 << 20) - static_cast<double>(dispatch::tensor_bytes_live());
    r.memory_budget = std::max(0.0, free - runtime);
    r.budget_source =
        str_cat("the host's free memory over ", ctx.ranks_per_host, " ranks, less this process's ",
                static_cast<int64_t>(runtime / (1 << 20)), " MiB of runtime");
  }
  if (links.overlap >= 0) {
    r.overlap = links.overlap;
    r.overlap_source = str_cat("from ", links.path.empty() ? "the links" : links.path, ", ", links.source);
  } else {
    r.overlap = 0;
    r.overlap_source = "not in the profile: no overlap assumed (measure it with dtrain bench comm --profile)";
  }
  if (o.bucket_bytes > 0) r.bucket_bytes = {o.bucket_bytes};
  const auto t0 = std::chrono::steady_clock::now();
  out.plan = plan::make_plan(out.facts, *compute, links, r);
  out.plan.notes.push_back(str_cat(
      "planned ", out.plan.candidates.size(), " candidates in ",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s (profiles aside)"));
  return out;
}

void apply_candidate(TrainOptions& o, const plan::Candidate& c) {
  o.strategy = c.strategy;
  o.tp = c.tp;
  o.sequence_parallel = c.sequence_parallel;
  o.checkpoint_activations = c.checkpoint_activations;
  o.accumulation = c.accumulation;
  o.accumulation_given = true;
  o.bucket_bytes = c.bucket_bytes;
  o.shard_size = c.shard_size;
  o.mesh_order = c.mesh_order;
}

int run_plan(const TrainOptions& o, const PlanCommandOptions& p) {
  PlanContext ctx;
  const char* ws = std::getenv("WORLD_SIZE");
  const bool in_job = ws != nullptr && std::atoi(ws) > 1 && p.world == 0;
  if (in_job) {  // inside dtrain run: the live ranks (links measured on them when missing)
    ctx.group = comm::init();
    ctx.world = ctx.group->group_size();
    ctx.backend = ctx.group->name();
  } else {
    ctx.world = p.world > 0 ? p.world : 1;
    const char* b = std::getenv("DTRAIN_BACKEND");
    ctx.backend = !p.backend.empty() ? p.backend : b && *b ? b : "gloo";
  }
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  ctx.ranks_per_host = p.ranks_per_host > 0                      ? p.ranks_per_host
                       : in_job && local && std::atoi(local) > 0 ? std::atoi(local)
                                                                 : ctx.world;
  if (ctx.ranks_per_host > ctx.world || ctx.world % ctx.ranks_per_host != 0) {
    throw ValueError(
        str_cat("plan: --ranks-per-host ", ctx.ranks_per_host, " must divide --world ", ctx.world, "."));
  }
  const GptPlan g = plan_gpt(o, ctx);
  if (ctx.group && ctx.group->group_rank() != 0) return 0;
  if (p.json) {
    for (const auto& n : g.plan.notes) std::fprintf(stderr, "# %s\n", n.c_str());
    std::fflush(stderr);
    for (const auto& c : g.plan.candidates) {
      std::printf("%s\n", plan::candidate_json(c).c_str());
      std::fflush(stdout);  // (whole lines, never mixed with the notes on stderr)
    }
  } else {
    std::printf("dtrain plan: %s, batch %ld, %ld ranks (%ld per host)\n", g.facts.description.c_str(),
                static_cast<long>(o.batch), static_cast<long>(ctx.world),
                static_cast<long>(ctx.ranks_per_host));
    std::printf("%s", plan::plan_table(g.plan).c_str());
    const plan::Candidate& c = g.plan.candidates[g.plan.chosen];
    std::printf(
        "\nchosen: %s, predicted %.2f ms a step, %.1f MiB of tensors per rank\n  run it: dtrain train",
        c.name().c_str(), c.predicted_step_s * 1e3, c.predicted_peak_bytes / (1 << 20));
    for (const auto& f : c.flags) std::printf(" %s", f.c_str());
    std::printf("\n%s", plan::placements(c, g.facts, ctx.world).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::train
