// The planner; see planner.h.
#include "plan/planner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/strategy.h"
#include "plan/memory_model.h"

namespace dtrain::plan {

namespace {

// A candidate fits when its predicted peak with this margin is within the budget: the predictions are
// within a few percent (bench/RESULTS.md), and a run over its budget is worse than a slower one.
constexpr double kMemoryMargin = 0.05;

std::string size_text(int64_t bytes) {
  if (bytes % (int64_t{1} << 20) == 0) return str_cat(bytes >> 20, "M");
  if (bytes % 1024 == 0) return str_cat(bytes >> 10, "K");
  return str_cat(bytes);
}

double mib(double bytes) { return bytes / (1 << 20); }

std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, v);
  return text;
}

std::string slower_reason(const Candidate& c, const Candidate& best, int64_t n) {
  const double pct = 100.0 * (c.predicted_step_s / best.predicted_step_s - 1.0);
  std::string why;
  const double dc = c.compute_s - best.compute_s, dm = c.exposed_comm_s - best.exposed_comm_s,
               dopt = c.optimizer_s - best.optimizer_s;
  if (dm >= dc && dm >= dopt) {
    why = str_cat("exposed communication ", fixed(c.exposed_comm_s * 1e3, 1), " ms against ",
                  fixed(best.exposed_comm_s * 1e3, 1));
  } else if (dc >= dopt) {
    why = str_cat("compute ", fixed(c.compute_s * 1e3, 1), " ms against ", fixed(best.compute_s * 1e3, 1));
  } else {
    why = str_cat("optimizer ", fixed(c.optimizer_s * 1e3, 1), " ms against ",
                  fixed(best.optimizer_s * 1e3, 1));
  }
  std::string reason = str_cat(c.strategy, ": ", fixed(std::max(0.0, pct), 1), "% slower (", why, ")");
  if (c.strategy != best.strategy) {
    const auto state = [&](const Candidate& x) {
      const parallel::Strategy s = parallel::parse_strategy(x.strategy);
      const double share = x.strategy == "hsdp" ? static_cast<double>(x.shard_size) : static_cast<double>(n);
      return fixed(model_state_bytes_per_param(s, share), 1);
    };
    reason += str_cat(", model state ", state(c), " bytes a parameter against ", state(best));
  }
  return reason;
}

}  // namespace

std::vector<std::string> candidate_flags(const Candidate& c, int64_t batch) {
  std::vector<std::string> f{"--strategy",     c.strategy,
                             "--tp",           str_cat(c.tp),
                             "--batch",        str_cat(batch),
                             "--accumulation", str_cat(c.accumulation),
                             "--bucket-bytes", size_text(c.bucket_bytes)};
  if (c.shard_size > 0) {
    f.push_back("--shard-size");
    f.push_back(str_cat(c.shard_size));
  }
  if (!c.mesh_order.empty()) {
    f.push_back("--mesh-order");
    f.push_back(c.mesh_order);
  }
  if (c.sequence_parallel) f.push_back("--sequence-parallel");
  if (c.checkpoint_activations) f.push_back("--checkpoint-activations");
  return f;
}

Plan make_plan(const ModelFacts& f, const ComputeModel& compute, const ClusterProfile& links,
               const PlanRequest& r) {
  if (r.topo.world < 1 || r.topo.ranks_per_host < 1 || r.batch < 1 || !(r.memory_budget > 0) ||
      f.params.empty()) {
    throw ValueError(str_cat("plan: world ", r.topo.world, ", ranks per host ", r.topo.ranks_per_host,
                             ", batch ", r.batch, ", memory budget ", r.memory_budget, " bytes and ",
                             f.params.size(), " parameters must all be positive."));
  }
  std::vector<int64_t> degrees{1};
  for (int64_t t : f.tp_degrees) {
    if (t > 1 && r.topo.world % t == 0 && std::find(degrees.begin(), degrees.end(), t) == degrees.end())
      degrees.push_back(t);
  }
  const std::vector<int64_t> buckets =
      r.bucket_bytes.empty() ? std::vector<int64_t>{default_bucket_bytes()} : r.bucket_bytes;
  Plan plan;
  for (int64_t tp : degrees) {
    const int64_t n = r.topo.world / tp;
    for (bool sp : {false, true}) {
      if (sp && (tp == 1 || !f.can_sequence_parallel)) continue;
      for (bool ckpt : {false, true}) {
        if (ckpt && !f.can_checkpoint) continue;
        for (int64_t acc = 1; acc <= r.max_accumulation; acc *= 2) {
          if (r.batch % (acc * n) != 0) continue;
          Candidate base;
          base.tp = tp;
          base.sequence_parallel = sp;
          base.checkpoint_activations = ckpt;
          base.accumulation = acc;
          base.micro_batch = r.batch / (acc * n);
          std::vector<Candidate> here;
          for (const char* s : {"dp", "zero1", "zero2", "zero3"}) {
            if (n == 1 && std::string(s) != "dp") continue;  // (one data-parallel rank: nothing to shard)
            const bool units = std::string(s) == "zero3";
            for (int64_t b : units ? zero3_unit_sizes(f, tp) : buckets) {
              Candidate c = base;
              c.strategy = s;
              c.bucket_bytes = b;
              here.push_back(c);
            }
          }
          for (int64_t g = 2; g < n; ++g) {
            if (n % g != 0) continue;
            for (int64_t b : zero3_unit_sizes(f, tp)) {
              Candidate c = base;
              c.strategy = "hsdp";
              c.shard_size = g;
              c.bucket_bytes = b;
              here.push_back(c);
            }
          }
          // on several hosts, each 2-axis mesh also with its axes the other way round (plan/step_model.h)
          if (r.topo.world > r.topo.ranks_per_host) {
            const size_t count = here.size();
            for (size_t i = 0; i < count; ++i) {
              Candidate c = here[i];
              c.mesh_order = c.strategy == "hsdp" ? parallel::kShardGroupsStrided
                             : tp > 1 && n > 1    ? parallel::kTpGroupsStrided
                                                  : "";
              if (!c.mesh_order.empty()) here.push_back(c);
            }
          }
          for (auto& c : here) {
            predict(c, f, compute, links, r.topo, r.overlap);
            c.fits = c.predicted_peak_bytes * (1 + kMemoryMargin) <= r.memory_budget;
            c.flags = candidate_flags(c, r.batch);
            plan.candidates.push_back(std::move(c));
          }
        }
      }
    }
  }
  if (plan.candidates.empty()) {
    throw ValueError(str_cat("plan: no layout divides world ", r.topo.world, " and batch ", r.batch,
                             " (every data-parallel rank needs whole samples). Use a batch that is a ",
                             "multiple of the world size."));
  }
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.fits != b.fits) return a.fits;
                     if (a.fits) {
                       if (a.predicted_step_s != b.predicted_step_s)
                         return a.predicted_step_s < b.predicted_step_s;
                       return a.predicted_peak_bytes < b.predicted_peak_bytes;
                     }
                     return a.predicted_peak_bytes < b.predicted_peak_bytes;
                   });
  if (!plan.candidates.front().fits) {
    const Candidate& least = plan.candidates.front();
    throw ValueError(str_cat("plan: no candidate fits the memory budget of ", fixed(mib(r.memory_budget), 1),
                             " MiB per rank (", r.budget_source, ") with a 5% margin. The smallest, ",
                             least.name(), ", needs ", fixed(mib(least.predicted_peak_bytes), 1),
                             " MiB. Raise --memory-budget, use more ranks, or a smaller batch or model."));
  }
  const Candidate& best = plan.candidates.front();
  int rank = 0;
  for (auto& c : plan.candidates) {
    if (!c.fits) {
      c.reason = str_cat(c.strategy, ": ", fixed(mib(c.predicted_peak_bytes), 1),
                         " MiB (+5% margin) > budget ", fixed(mib(r.memory_budget), 1), " MiB");
      continue;
    }
    c.rank = ++rank;
    if (rank == 1) {
      c.chosen = true;
      c.reason = str_cat("the fastest predicted that fits: compute ", fixed(c.compute_s * 1e3, 1),
                         " ms, exposed communication ", fixed(c.exposed_comm_s * 1e3, 1), " ms, optimizer ",
                         fixed(c.optimizer_s * 1e3, 1), " ms");
    } else {
      c.reason = slower_reason(c, best, r.topo.world / c.tp);
    }
  }
  plan.chosen = 0;
  plan.notes.push_back(str_cat("compute: ", compute.source()));
  plan.notes.push_back(str_cat("links: ", links.built_in ? "" : links.path + ", ", links.source));
  plan.notes.push_back(str_cat("overlap: ", fixed(r.overlap, 2), " (", r.overlap_source, ")"));
  plan.notes.push_back(str_cat("memory budget: ", fixed(mib(r.memory_budget), 1),
                               " MiB of tensors per rank (", r.budget_source, ")"));
  return plan;
}

std::string Candidate::name() const {
  std::string s = strategy == "hsdp" ? str_cat("hsdp", shard_size) : strategy;
  if (tp > 1) s += str_cat(" tp", tp, sequence_parallel ? " sp" : "");
  if (checkpoint_activations) s += " ckpt";
  s += str_cat(" mb", micro_batch, "x", accumulation);
  s += str_cat(strategy == "zero3" || strategy == "hsdp" ? " units " : " buckets ", size_text(bucket_bytes));
  if (!mesh_order.empty()) s += str_cat(" mesh ", mesh_order);
  return s;
}

}  // namespace dtrain::plan
