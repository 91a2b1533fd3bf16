// What the planner knows of the machines (docs/planning.md, "Profiles"): the links' alpha-beta per
// collective inside a host and across hosts, and, for planning a cluster that is not here, a compute rate.
// One JSON file, the one `dtrain bench comm --profile FILE` writes (format "dtrain-comm-profile"):
//
//   {"format": "dtrain-comm-profile", "version": 1, "backend": "gloo", "source": "measured ...",
//    "ranks": 2, "collectives": {"all_reduce": {"alpha_s": 1.2e-4, "beta_s_per_byte": 9e-10}, ...},
//    "inter_host": {"ranks": 4, "collectives": {...}},                 (optional: links across hosts)
//    "overlap": 0.42, "blocking_penalty_s": 4e-4,  (optional: plan/overlap_benchmark.h, and the blocking
//    calls' cost beyond alpha-beta, plan/in_step_costs.h) "compute": {"flops_per_s": 3e13,
//    "optimizer_s_per_param": 1e-10}} (optional: without a measured
//                                                                       compute profile)
//
// "collectives" were measured with every rank on one host; "inter_host" over ranks on several hosts (the
// ring then crosses the slower links). beta is seconds per bus byte (nccl-tests' bus bandwidth); alpha is
// per call, at the measured number of ranks, and scaled by (n - 1) / (ranks - 1) to other group sizes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "comm/cost_model.h"
#include "plan/in_step_costs.h"

namespace dtrain::plan {

struct LinkProfile {
  int ranks = 0;  // the group size the figures were measured at (0: not measured)
  std::map<std::string, comm::AlphaBeta> collectives;
  bool measured() const { return ranks > 0 && !collectives.empty(); }
};

struct ClusterProfile {
  std::string path;     // the file it came from ("" built in)
  std::string backend;  // gloo, mpi, nccl
  std::string source;   // how the figures were obtained (measured, public specifications, built-in)
  bool built_in = false;
  LinkProfile intra_host, inter_host;
  double flops_per_s = 0;            // compute rate for planning without a measured compute profile
  double optimizer_s_per_param = 0;  // optimizer step per parameter, with flops_per_s
  double memory_bytes = 0;           // memory a rank has for tensors (a device's), with flops_per_s
  double overlap = -1;               // plan/overlap_benchmark.h (< 0: not measured)
  // Per blocking (tensor-parallel) call in a step, beyond alpha-beta, where no in-step costs were measured
  // (0: none). Read from the file for a cluster that is not here.
  double blocking_penalty_s = 0;
  // This model's in-step costs on these links (plan/in_step_costs.h): not part of the file; plan_module sets
  // them from their own cache.
  InStepCosts in_step;

  // Seconds of one collective `op` moving `bytes` per rank (all_reduce's buffer, all_gather's output,
  // reduce_scatter's input) over `n` ranks; `across_hosts`: the group spans hosts. 0 for n == 1. ValueError
  // when the profile lacks the links or the op (naming the file and how to measure them).
  double seconds(const std::string& op, int64_t n, double bytes, bool across_hosts) const;
};

// Reads `path`. ValueError naming the file and what is wrong: missing, not JSON, another format, negative or
// missing figures.
ClusterProfile read_cluster_profile(const std::string& path);
// Writes `p` (atomically), its intra-host figures as "collectives".
void write_cluster_profile(const std::string& path, const ClusterProfile& p);
// Figures for loopback TCP on one host (DESIGN §8: ~0.2 ms a call, ~1 GB/s), used only when the user asks
// for them (--profile builtin); every output that uses them says so.
ClusterProfile built_in_cluster_profile();

}  // namespace dtrain::plan
