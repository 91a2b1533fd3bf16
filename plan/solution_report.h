// A solved step, readable (`dtrain explain solve`, docs/planning.md "Explaining a solved step"): the
// predicted step time and memory per rank, every parameter's (and every other outside value's) placements,
// every redistribution with the op that needs it, its bytes and predicted time; and two plans of one step
// side by side (two memory budgets, say).
#pragma once

#include <string>

#include "comm/cost_model.h"
#include "plan/sharding_solver.h"
#include "plan/step_graph.h"
#include "plan/step_record.h"

namespace dtrain::plan {

std::string explain_solution(const StepRecord& record, const StepGraph& g, const SolverSolution& s,
                             const comm::CostModel& comm);

// The placements that differ between `a` and `b` (labelled `a_label`, `b_label`), then both plans' totals.
std::string diff_solutions(const StepRecord& record, const StepGraph& g, const SolverSolution& a,
                           const SolverSolution& b, const std::string& a_label, const std::string& b_label,
                           const comm::CostModel& comm);

}  // namespace dtrain::plan
