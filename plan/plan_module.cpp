// plan_module(); see plan_module.h.
#include "plan/plan_module.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "comm/gather_text.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "dispatch/tensor_memory.h"
#include "parallel/meta_device.h"
#include "plan/comm_benchmark.h"
#include "plan/compute_model.h"
#include "plan/measure_in_step.h"
#include "plan/overlap_benchmark.h"
#include "plan/plan_report.h"
#include "plan/step_model.h"

namespace dtrain::plan {

namespace {

// The engines' revision, in the names of the figures measured on them (the links, the in-step costs): what
// their collectives cost and hold changes with it, so figures measured before are measured again. e2: Gloo's
// all-gather as in-place broadcasts, and ZeRO's reduce-scatter in its own bucket.
constexpr const char* kEngineRevision = "e2";

// The links: r.profile's file, builtin, or the cache; measured on the live ranks when missing.
ClusterProfile links_for(const ModulePlanRequest& r, bool* measured_now) {
  *measured_now = false;
  if (r.profile == "builtin") return built_in_cluster_profile();
  if (!r.profile.empty()) return read_cluster_profile(r.profile);
  ClusterProfile none;
  if (r.world == 1) {
    none.source = "one rank: no communication";
    return none;
  }
  const std::string path = str_cat(default_cache_dir(), "/comm-", kEngineRevision, "-", r.backend, "-",
                                   r.world, "ranks-", r.ranks_per_host, "perhost.json");
  const bool lead = !r.group || r.group->group_rank() == 0;
  if (r.group) {  // every rank must take the same branch: rank 0's view of the cache decides
    const std::vector<std::string> seen =
        comm::all_gather_text(r.group, std::filesystem::exists(path) ? "cached" : "missing");
    if (seen[0] == "cached") return read_cluster_profile(path);
  } else if (std::filesystem::exists(path)) {
    return read_cluster_profile(path);
  }
  if (!r.group || r.group->group_size() != r.world) {
    throw ValueError(str_cat(
        "plan: no profile of the ", r.backend, " links at ", r.world, " ranks (", r.ranks_per_host,
        " per host) is cached at ", path, ". Measure one with `dtrain run -n ", r.world,
        " -- dtrain bench comm --profile FILE` and pass --profile FILE, run the plan inside `dtrain run -n ",
        r.world, "` (it measures and caches one), or pass --profile builtin for built-in figures."));
  }
  CommBenchOptions bo;
  bo.ops = {"all_reduce", "all_gather", "reduce_scatter"};
  bo.min_bytes = 4 << 10;
  bo.max_bytes = 4 << 20;
  bo.step_factor = 8;
  ClusterProfile p;
  p.backend = r.group->name();
  p.source = "measured by dtrain on these ranks (a short sweep, cached)";
  const bool across = r.ranks_per_host < r.world;
  LinkProfile& links = across ? p.inter_host : p.intra_host;
  links.ranks = static_cast<int>(r.world);
  links.collectives = run_comm_benchmark(*r.group, bo, [](const CommBenchRow&) {}).collectives;
  if (across) {  // each host's ranks at once (consecutive ranks share a host), each host's own links
    const int rank = r.group->group_rank(), per = static_cast<int>(r.ranks_per_host);
    const comm::BackendPtr host = r.group->split(rank / per, rank % per);
    p.intra_host.ranks = per;
    if (per > 1)
      p.intra_host.collectives = run_comm_benchmark(*host, bo, [](const CommBenchRow&) {}).collectives;
    p.overlap = measure_overlap(per > 1 ? *host : *r.group);
  } else {
    p.overlap = measure_overlap(*r.group);
  }
  *measured_now = true;
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(default_cache_dir(), ec);
    write_cluster_profile(path, p);
  }
  p.path = path;
  return p;
}

// The compute: counted from the shape when the links' profile carries a compute rate, else measured (cached).
std::unique_ptr<ComputeModel> compute_for(const ModulePlanRequest& r, const ModelFacts& facts,
                                          const ClusterProfile& links, const std::vector<int64_t>& degrees,
                                          std::string* signature) {
  if (links.flops_per_s > 0) {
    if (!facts.shape) {
      throw ValueError(str_cat("plan: profile ", links.path, " carries a compute rate (a cluster not here), ",
                               "which counts a transformer's compute from its shape; ", facts.description,
                               " has no shape given. Plan it on its own machine, from a measured profile."));
    }
    return analytic_compute(*facts.shape, links.flops_per_s, links.optimizer_s_per_param);
  }
  MeasureOptions mo;
  mo.largest_micro_batch.clear();
  mo.largest_micro_batch.emplace_back(1, std::max<int64_t>(1, r.batch / r.world));
  for (int64_t t : degrees)
    mo.largest_micro_batch.emplace_back(t, std::max<int64_t>(1, r.batch * t / r.world));
  mo.smallest_micro_batch = std::max<int64_t>(1, r.batch / (8 * r.world));  // (accumulation up to 8)
  if (r.world > 1) {  // the data-parallel strategies rehearsed over the world (tp 1)
    const int64_t mb = std::max<int64_t>(1, r.batch / r.world / 4);
    const int64_t buckets = r.bucket_bytes > 0 ? r.bucket_bytes : default_bucket_bytes();
    for (bool ckpt : {false, true}) {
      if (ckpt && !facts.can_checkpoint) continue;
      for (int64_t acc : {1, 2}) {
        for (const char* s : {"dp", "zero1", "zero2"})
          mo.rehearsals.push_back({s, r.world, buckets, ckpt, acc, mb});
        for (int64_t u : zero3_unit_sizes(facts, 1))
          mo.rehearsals.push_back({"zero3", r.world, u, ckpt, acc, mb});
      }
    }
  }
  const int threads_before = at::get_num_threads();
  if (!r.group) {  // as a rank of that world would run: the host's cores shared by its ranks
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(std::max(1, cores / static_cast<int>(std::max<int64_t>(1, r.ranks_per_host))));
  }
  bool measured = false;
  const std::string dir = default_cache_dir();
  // Every rank measures (their contention is in the figures), rank 0's are kept and cached.
  const bool lead = !r.group || r.group->group_rank() == 0;
  ComputeProfile profile = cached_compute_profile(r.target, mo, dir, &measured, lead);
  at::set_num_threads(threads_before);
  *signature = profile.signature;
  return measured_compute(std::move(profile),
                          measured ? "measured now, cached in " + dir : "cached in " + dir);
}

// This model's in-step costs on these links (plan/in_step_costs.h): cached beside the compute profile,
// measured on the live ranks when missing (rank 0's view of the cache decides for all). A note says which.
InStepCosts in_step_for(const ModulePlanRequest& r, const std::string& signature, const ModelFacts& facts,
                        const ComputeModel& compute, const ClusterProfile& links, double overlap,
                        const std::vector<int64_t>& degrees, std::string* note) {
  const int64_t buckets = r.bucket_bytes > 0 ? r.bucket_bytes : default_bucket_bytes();
  const std::string key = str_cat(signature, "-", kEngineRevision, "-", r.backend, "-", r.world, "r",
                                  r.ranks_per_host, "-b", r.batch, "-", buckets);
  const std::string path = str_cat(default_cache_dir(), "/in-step-", key, ".json");
  auto cached = [&] {
    if (!std::filesystem::exists(path)) return false;
    try {
      return read_in_step_costs(path).key == key;
    } catch (const ValueError&) {
      return false;
    }
  };
  bool have = false;
  if (r.group && r.group->group_size() > 1) {
    have = comm::all_gather_text(r.group, cached() ? "cached" : "missing")[0] == "cached";
  } else {
    have = cached();
  }
  if (have) {
    *note = str_cat("in-step costs: cached in ", path);
    return read_in_step_costs(path);
  }
  if (!r.group || r.group->group_size() != r.world) {
    *note =
        str_cat("in-step costs: none (they are measured on live ranks: run the plan inside `dtrain run -n ",
                r.world, "`); tensor parallel's calls take the profile's blocking_penalty_s (",
                links.blocking_penalty_s, " s)");
    return {};
  }
  InStepRequest q;
  q.target = &r.target;
  q.world = r.group;
  q.facts = &facts;
  q.compute = &compute;
  q.links = links;
  q.topo = {r.world, r.ranks_per_host};
  q.overlap = overlap;
  q.batch = r.batch;
  q.tp_degrees = degrees;
  q.bucket_bytes = buckets;
  InStepCosts c = measure_in_step(q);
  c.key = key;
  if (r.group->group_rank() == 0) write_in_step_costs(path, c);
  *note = str_cat("in-step costs: measured now in ", c.measured_s, " s, cached in ", path);
  return c;
}

// Every rank takes rank 0's plan (its measurements) or its error, so that all run the same layout: the
// ranks measure their compute apart, and their predictions differ by their noise.
void agree_on_rank0s(const comm::BackendPtr& group, Plan& plan, std::string& error) {
  std::string mine;
  if (group->group_rank() == 0) {
    if (!error.empty()) {
      mine = "!" + error;
    } else {
      for (const auto& n : plan.notes) mine += "#" + n + "\n";
      for (const auto& c : plan.candidates) mine += candidate_json(c) + "\n";
    }
  }
  const std::string lead = comm::all_gather_text(group, mine)[0];
  error.clear();
  if (!lead.empty() && lead[0] == '!') {
    error = lead.substr(1);
    return;
  }
  if (group->group_rank() == 0) return;
  plan = Plan{};
  for (size_t at = 0; at < lead.size();) {
    const size_t end = std::min(lead.find('\n', at), lead.size());
    const std::string line = lead.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    if (line[0] == '#') {
      plan.notes.push_back(line.substr(1));
      continue;
    }
    plan.candidates.push_back(candidate_from_json(line));
    if (plan.candidates.back().chosen) plan.chosen = static_cast<int>(plan.candidates.size() - 1);
  }
}

}  // namespace

ModulePlan plan_module(const ModulePlanRequest& r) {
  if (!r.target.build || !r.target.loss) {
    throw ValueError(
        "plan: the module's target needs build (a fresh module) and loss (its mean loss on a "
        "micro-batch) set.");
  }
  if (r.world < 1 || r.ranks_per_host < 1 || r.ranks_per_host > r.world || r.world % r.ranks_per_host != 0) {
    throw ValueError(
        str_cat("plan: --ranks-per-host ", r.ranks_per_host, " must divide --world ", r.world, "."));
  }
  ModulePlan out;
  std::vector<int64_t> degrees;
  if (r.target.tp_plan) {
    for (int64_t t : r.tp_degrees) {
      if (t > 1 && r.world % t == 0) degrees.push_back(t);
    }
  }
  {
    std::shared_ptr<torch::nn::Module> meta;
    {
      parallel::OnMetaDevice on_meta;
      meta = r.target.build();
    }
    const parallel::TensorParallelPlan tp_plan =
        r.target.tp_plan ? r.target.tp_plan(false) : parallel::TensorParallelPlan{};
    out.facts = model_facts(*meta, tp_plan, degrees, !r.target.checkpoint_patterns.empty(), r.data_bytes,
                            r.target.description);
  }
  out.facts.shape = r.shape;
  out.facts.can_sequence_parallel = r.target.sequence_parallel && !degrees.empty();
  bool links_measured = false;
  ClusterProfile links = links_for(r, &links_measured);
  std::string signature;
  const std::unique_ptr<ComputeModel> compute = compute_for(r, out.facts, links, degrees, &signature);

  PlanRequest p;
  p.topo = {r.world, r.ranks_per_host};
  p.batch = r.batch;
  if (r.memory_budget > 0) {
    p.memory_budget = static_cast<double>(r.memory_budget);
    p.budget_source = str_cat("--memory-budget ", r.memory_budget);
  } else if (links.flops_per_s > 0 && links.memory_bytes > 0) {
    p.memory_budget = links.memory_bytes;
    p.budget_source = str_cat("the memory_bytes of ", links.path);
  } else {
    const double free = host_available_bytes() / static_cast<double>(r.ranks_per_host);
    const double runtime =
        process_memory_mib("VmRSS") * (1 << 20) - static_cast<double>(dispatch::tensor_bytes_live());
    p.memory_budget = std::max(0.0, free - runtime);
    p.budget_source =
        str_cat("the host's free memory over ", r.ranks_per_host, " ranks, less this process's ",
                static_cast<int64_t>(runtime / (1 << 20)), " MiB of runtime");
  }
  if (links.overlap >= 0) {
    p.overlap = links.overlap;
    p.overlap_source = str_cat("from ", links.path.empty() ? "the links" : links.path, ", ", links.source);
  } else {
    p.overlap = 0;
    p.overlap_source = "not in the profile: no overlap assumed (measure it with dtrain bench comm --profile)";
  }
  if (r.bucket_bytes > 0) p.bucket_bytes = {r.bucket_bytes};
  std::string in_step_note;
  if (links.flops_per_s == 0 && r.world > 1) {
    links.in_step = in_step_for(r, signature, out.facts, *compute, links, p.overlap, degrees, &in_step_note);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    out.plan = make_plan(out.facts, *compute, links, p);
  } catch (const ValueError& e) {
    error = e.what();
  }
  if (!in_step_note.empty()) out.plan.notes.push_back(in_step_note);
  out.plan.notes.push_back(str_cat(
      "planned ", out.plan.candidates.size(), " candidates in ",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s (profiles aside)"));
  if (r.group && r.group->group_size() > 1) agree_on_rank0s(r.group, out.plan, error);
  if (!error.empty()) throw ValueError(error);
  return out;
}

}  // namespace dtrain::plan
