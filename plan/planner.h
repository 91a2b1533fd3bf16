// The planner behind `dtrain plan` and `dtrain train --strategy auto` (docs/planning.md): enumerates the
// layouts a world allows (dp, zero1-3 with two unit sizes, hsdp with its shard sizes, each tensor-parallel
// degree the model allows with and without sequence parallel, activation checkpointing off and on, every
// accumulation of the global batch from 1 to 8 that divides it evenly), predicts each one's step time and
// peak memory per rank (plan/step_model.h), drops those whose peak with a 5% margin is over the memory
// budget, and ranks the rest by predicted time (then memory). Pure: no ranks, no measurement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/candidate.h"
#include "plan/cluster_profile.h"
#include "plan/compute_model.h"
#include "plan/model_facts.h"
#include "plan/step_model.h"

namespace dtrain::plan {

struct PlanRequest {
  Topology topo;
  int64_t batch = 16;          // samples per optimizer step, over all data-parallel ranks
  double memory_budget = 0;    // bytes held by tensors, per rank
  std::string budget_source;   // how it was set, for the report
  double overlap = 0;          // step_model.h
  std::string overlap_source;  // where it came from
  // Gradient bucket sizes for dp, zero1 and zero2 (empty: default_bucket_bytes()).
  std::vector<int64_t> bucket_bytes;
  int64_t max_accumulation = 8;
};

struct Plan {
  std::vector<Candidate> candidates;  // ranked ones first (rank 1, 2, ...), then those over the budget
  int chosen = 0;                     // index into candidates
  std::vector<std::string> notes;     // the sources of every figure (profiles, budget, overlap)
};

// ValueError when the request is empty (no world, batch or budget), when no layout divides the world and
// batch, and when no candidate fits the budget (naming the smallest candidate's predicted memory).
Plan make_plan(const ModelFacts& facts, const ComputeModel& compute, const ClusterProfile& links,
               const PlanRequest& request);

// The `dtrain train` arguments that run `c` with global batch `batch`.
std::vector<std::string> candidate_flags(const Candidate& c, int64_t batch);

}  // namespace dtrain::plan
