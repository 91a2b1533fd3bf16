// Plans any module's layout (docs/planning.md, "From C++"): gathers the planner's inputs for a module given
// as a ProfileTarget (how to build it, its loss on a micro-batch, its checkpointable blocks and its
// tensor-parallel plan), then plans. The inputs: the module's facts (built once on the meta device, so any
// size plans without its memory), its compute profile (measured on this machine and cached, or counted from
// `shape` when the links' profile carries a compute rate), the links (a profile file, built-in figures when
// asked for, or measured on the live ranks once and cached), the overlap and the memory budget.
// `dtrain plan` and `--strategy auto` call it for the built-in GPT (apps/dtrain/gpt/plan_gpt.h); a C++ user
// calls it for their own module and runs the chosen candidate with the Trainer (train/apply_plan.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "plan/measure_compute.h"
#include "plan/model_facts.h"
#include "plan/planner.h"

namespace dtrain::plan {

struct ModulePlanRequest {
  ProfileTarget target;
  // The tensor-parallel degrees target.tp_plan allows (e.g. dividing the heads); those dividing the world
  // are planned. Empty (or no tp_plan): tp 1 only.
  std::vector<int64_t> tp_degrees;
  int64_t data_bytes = 0;  // tensors the run holds besides the model and its step (a dataset in memory)
  // For a cluster that is not here (a profile with a compute rate): the transformer's shape, its compute
  // counted from it. Without it such a profile is an error.
  std::optional<TransformerShape> shape;
  int64_t batch = 0;         // samples per optimizer step over all data-parallel ranks
  int64_t bucket_bytes = 0;  // dp, zero1, zero2 buckets (0: the strategies' default)
  int64_t memory_budget =
      0;  // bytes held by tensors per rank (0: the rank's share of the host's free memory)
  // The links: "" the cached profile for this backend, world and hosts (measured on `group` when missing),
  // "builtin" built-in figures (the output says so), or a profile file.
  std::string profile;
  int64_t world = 1;
  int64_t ranks_per_host = 1;    // consecutive ranks share a host
  std::string backend = "gloo";  // whose links
  // The live ranks (collective over them: every rank calls with the same request), or null to plan without
  // ranks (the links must then come from a file or the cache).
  comm::BackendPtr group;
};

struct ModulePlan {
  Plan plan;
  ModelFacts facts;
};

// Plans `r` (see the file comment). ValueError for a bad request, a missing or malformed profile, links the
// profile lacks, or a budget nothing fits (naming the smallest candidate's predicted memory).
ModulePlan plan_module(const ModulePlanRequest& r);

}  // namespace dtrain::plan
