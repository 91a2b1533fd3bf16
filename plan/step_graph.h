// The sharding solver's problem for a recorded step (issue 32; docs/planning.md, "From a record to the
// solver's graph"): one node per op, whose options are the ways its rule lets it run on the mesh (the
// record's choices), and one per value from outside the step (a parameter, the optimizer's state, an input),
// whose options are its placements; an edge wherever a value flows from the node that places it to an op that
// reads it, costed by the redistribution its placement needs, and from the last writer of a parameter or of
// optimizer state back to its node, since the next step reads it as this one left it.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "comm/cost_model.h"
#include "plan/sharding_solver.h"
#include "plan/step_record.h"
#include "tensor/placement.h"

namespace dtrain::plan {

struct StepGraph {
  SolverProblem problem;
  // What solver node i stands for: record.ops[op[i]] (value[i] = -1), or the outside value
  // record.values[value[i]] (op[i] = -1), whose option o places it as placements[i][o].
  std::vector<int> op, value;
  std::vector<std::vector<tensor::Placements>> placements;  // per value node; empty for op nodes
  int peak_op = 0;              // where the step's live bytes peak, replicated (memory is counted there)
  double replicated_bytes = 0;  // the live bytes there, everything replicated (one rank's whole step)
};

// The graph of `record` on a mesh of `mesh_shape`. The record must carry its ops' choices for that shape
// (record_step's `mesh_shape`); an op without a rule is a ValueError naming it. An option's time is the op's
// recorded seconds times the share of its work one rank does (the smallest share of any of its tensors that
// the choice shards); an edge's, the redistribution planner's seconds under `comm`
// (tensor/redistribute_plan.h). An option's memory is the bytes per rank, under its placements, of what it
// makes that is live at the replicated step's peak (outside values always are; an in-place write reuses its
// tensor's bytes; a view allocates nothing).
StepGraph build_step_graph(const StepRecord& record, const std::vector<int64_t>& mesh_shape,
                           const comm::CostModel& comm,
                           double memory_budget = std::numeric_limits<double>::infinity());

}  // namespace dtrain::plan
