// The sharding solver's problem for a recorded step (issue 32; docs/planning.md, "From a record to the
// solver's graph"): one node per op, whose options are the ways its rule lets it run on the mesh (the
// record's choices), and one per value from outside the step (a parameter, the optimizer's state, an input),
// whose options are its placements; an edge wherever a value flows from the node that places it to an op that
// reads it, costed by the redistribution its placement needs, and from the last writer of a parameter or of
// optimizer state back to its node, since the next step reads it as this one left it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/cost_model.h"
#include "plan/sharding_solver.h"
#include "plan/step_record.h"
#include "tensor/placement.h"

namespace dtrain::plan {

// An edge's cost where the placements differ and the reading op writes the value in place (the handler keeps
// a written tensor's placements, so no plan may move it there): no plan within reach costs this much.
constexpr double kForbidden_s = 1e9;

// Whether op `op` of `record` writes value `v` in place (an output of it is v's next state).
bool writes(const StepRecord& record, int op, int v);

struct StepGraph {
  SolverProblem problem;
  // What solver node i stands for: record.ops[op[i]] (value[i] = -1), or the outside value
  // record.values[value[i]] (op[i] = -1), whose option o places it as placements[i][o].
  std::vector<int> op, value;
  std::vector<std::vector<tensor::Placements>> placements;  // per value node; empty for op nodes
  int peak_op = 0;              // where the step's live bytes peak, replicated (memory is counted there)
  double replicated_bytes = 0;  // the live bytes there, everything replicated (one rank's whole step)
  std::vector<int64_t> mesh_shape;
  // The node of each op (-1: none) and of each outside value (-1: produced in the step); each value's
  // position among its producer's outputs.
  std::vector<int> node_of_op, node_of_value, output_index;

  // The node that places value `v`: its producer's, or its own for an outside value.
  int source(const StepRecord& r, int v) const;
  // Value `v`'s placements when the node that places it takes option `option`.
  const tensor::Placements& placement(const StepRecord& r, int v, int option) const;
};

// One redistribution of a plan: value `value`, as `op` reads it (-1: at the step's end, where state the step
// wrote goes back to the placement the next step reads it in).
struct Redistribution {
  int op = -1;
  int value = 0;
  tensor::Placements from, to;
  double bytes = 0;    // per rank, every step of it
  double seconds = 0;  // predicted
  int collectives = 0;
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

// Pins every outside value named `name` (a parameter's name, or a name given to record_step) to
// `placements`: the solver keeps it there (SolverNode::pinned). ValueError naming the value when no outside
// value has that name (with the names there are), or when `placements` is not one of its options (with them).
void pin_value(StepGraph& g, const StepRecord& record, const std::string& name,
               const tensor::Placements& placements);

// The redistributions a plan (`choice`: one option per node of `g`) makes in a step, in the order they
// happen.
std::vector<Redistribution> redistributions(const StepRecord& record, const StepGraph& g,
                                            const std::vector<int>& choice, const comm::CostModel& comm);

}  // namespace dtrain::plan
