// A training step from its record to the plan every rank follows, in one call (issue 32; docs/planning.md,
// "Training by a solved plan"): record_step_at, share_op_times, build_step_graph, the user's constraints,
// solve_sharding, share_choice and step_plan. The Trainer's `--strategy solve` runs it on the module it
// trains (train/solved_run.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "comm/cost_model.h"
#include "plan/sharding_solver.h"
#include "plan/step_graph.h"
#include "plan/step_plan.h"
#include "plan/step_record.h"

namespace dtrain::plan {

struct SolveStepOptions {
  std::vector<int64_t> mesh_shape;  // the mesh to plan for
  // The record's batches: `small` and twice that (record_step_at). 2 by default: a dim of size 1 lays out as
  // any other, so libtorch takes other paths at batch 1 (a narrowed row is contiguous and copies nothing).
  int64_t small = 2;
  double budget = 0;  // memory per rank the plan must fit, bytes (0: none)
  // Constraints: (value name, placements text) pairs ("h0.mlp.fc.weight", "S(0)"); and the inputs that stay
  // sharded by their dim 0 over mesh axis `batch_axis` (R on the others; -1: the solver's choice).
  std::vector<std::pair<std::string, std::string>> pins;
  std::vector<std::string> batch_inputs;
  int batch_axis = -1;
  SolverOptions solver;
};

struct SolvedStep {
  StepRecord record;
  StepGraph graph;
  SolverSolution solution;
  StepPlan plan;
  double record_s = 0, graph_s = 0, solve_s = 0;  // wall clock of each part
};

// Records `step` (a function of its batch size, as record_step_at takes it; `named` its tensors, the inputs
// at batches o.small and 2 x o.small among them) at `batch`, and solves it for `o.mesh_shape` under `comm`.
// With a `group` (every rank of it calls this alike), every rank gets rank 0's op times and rank 0's
// solution. ValueError for a pin or batch axis that names nothing there is, and for a budget no plan fits.
SolvedStep solve_step(const std::function<void(int64_t)>& step, int64_t batch, const NamedTensors& named,
                      const comm::CostModel& comm, const SolveStepOptions& o, comm::Backend* group);

}  // namespace dtrain::plan
