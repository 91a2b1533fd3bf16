// One layout the planner considers (plan/planner.h), and what it predicts for it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::plan {

struct Candidate {
  // The layout: `dtrain train`'s options of the same names.
  std::string strategy = "dp";  // dp, zero1, zero2, zero3, hsdp
  int64_t tp = 1;
  bool sequence_parallel = false;
  bool checkpoint_activations = false;
  int64_t micro_batch = 1;   // samples per data-parallel rank per micro-step
  int64_t accumulation = 1;  // micro-steps per optimizer step
  int64_t bucket_bytes = 0;  // gradient buckets (zero3 and hsdp: the units' size)
  int64_t shard_size = 0;    // hsdp: ranks per ZeRO-3 group
  // The mesh's axes, outermost first (--mesh-order): "" keeps tp (or hsdp's shard) groups on consecutive
  // ranks, inside a host; "tp,dp" or "shard,replicate" lays them across hosts, the other axis inside one.
  std::string mesh_order;

  // The prediction, per rank.
  double predicted_step_s = 0;
  double compute_s = 0;            // forward and backward of every micro-batch
  double optimizer_s = 0;          // the optimizer's step over this rank's parameters (or shards)
  double comm_s = 0;               // every collective's alpha-beta time
  double exposed_comm_s = 0;       // of it, what does not hide behind compute
  double strategy_overhead_s = 0;  // the strategy's own work beyond these (rehearsed)
  // Of exposed_comm_s, what the data-parallel strategy's calls cost in a real step beyond alpha-beta and the
  // overlap (plan/in_step_costs.h; may be negative: more hidden than the overlap says).
  double in_step_s = 0;
  // The collectives in a step that in_step_s and tp's in-step cost are counted over: tp's calls, and the
  // data-parallel strategy's gradient buckets (dp, zero1, zero2) or units' gathers and reduce-scatters
  // (zero3).
  int64_t comm_calls = 0;
  double predicted_peak_bytes = 0;
  std::map<std::string, double> memory;  // the peak's parts: "data", "model state", "activations", ...
  std::map<std::string, double> comm;    // comm_s by what causes it: "gradients", "tp", "zero3 gathers", ...

  // The ranking.
  bool fits = false;
  bool chosen = false;
  int rank = 0;  // 1: the best; 0: not ranked (over the budget)
  std::string reason;
  std::vector<std::string> flags;  // the `dtrain train` arguments that run it

  // "zero3 tp2 sp ckpt mb4x2 units 4M": for tables.
  std::string name() const;
};

}  // namespace dtrain::plan
