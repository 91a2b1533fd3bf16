// A solved step as the DTensor handler runs it (issue 32; docs/planning.md, "Executing a solved step"): the
// ops' placements the solver chose, in the recorded order, for tensor::FollowPlan; and the placements of the
// values from outside the step (parameters, the optimizer's state, inputs), by the names they were recorded
// under, for the caller to put them in before the first step.
//
//   record (plan/step_record.h) -> graph (plan/step_graph.h) -> solve (plan/sharding_solver.h)
//     -> step_plan -> place_values(parameters, optimizer state) -> FollowPlan around each step
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "plan/step_graph.h"
#include "plan/step_record.h"
#include "tensor/follow_plan.h"
#include "tensor/placement.h"

namespace dtrain::plan {

struct StepPlan {
  std::vector<tensor::PlannedOp> ops;  // one per recorded op, in order
  // The named outside values' placements (a name given to record_step: a parameter's, its optimizer state's,
  // an input's).
  std::vector<std::pair<std::string, tensor::Placements>> values;

  // The placements of the outside value named `name`; ValueError listing the names there are when none is.
  const tensor::Placements& placements(const std::string& name) const;
};

// The plan that choosing `choice` (one option per node of `g`, the solver's) makes of `record`. ValueError
// when a value from outside the step that the step writes (state it carries to the next step) has no name and
// the plan moves it from the placements it was recorded in: nothing could put it there. Name it at record
// time (optimizer_state() names an optimizer's).
StepPlan step_plan(const StepRecord& record, const StepGraph& g, const std::vector<int>& choice);

// Makes `choice` (a solver's solution for the graph every rank built) rank 0's on every rank of `group` (a
// broadcast): ranks that solve on their own may part ways where the solver's time limit falls, and ranks
// that follow different plans would call different collectives. ValueError when the ranks' graphs differ in
// size.
void share_choice(std::vector<int>& choice, comm::Backend& group);

// Redistributes every tensor of `tensors` whose name the plan has to the plan's placements for it, in place
// (Tensor::set_data: the module and the optimizer keep the same tensors). Returns how many it placed. The
// tensors are DTensors on the mesh the plan is for.
int place_values(const StepPlan& plan, const NamedTensors& tensors);

}  // namespace dtrain::plan
