// solve_step; see solve_step.h.
#include "plan/solve_step.h"

#include <chrono>
#include <limits>

#include "core/error.h"
#include "tensor/placement.h"

namespace dtrain::plan {

namespace {

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

SolvedStep solve_step(const std::function<void(int64_t)>& step, int64_t batch, const NamedTensors& named,
                      const comm::CostModel& comm, const SolveStepOptions& o, comm::Backend* group) {
  SolvedStep s;
  auto t = std::chrono::steady_clock::now();
  s.record = record_step_at(step, batch, o.small, o.mesh_shape, named);
  s.record_s = since(t);
  if (group != nullptr) share_op_times(s.record, *group);
  t = std::chrono::steady_clock::now();
  s.graph = build_step_graph(s.record, o.mesh_shape, comm);
  s.graph_s = since(t);
  for (const auto& [name, text] : o.pins) pin_value(s.graph, s.record, name, tensor::parse_placements(text));
  const int axes = static_cast<int>(o.mesh_shape.size());
  if (o.batch_axis >= 0) {
    if (o.batch_axis >= axes) {
      throw ValueError(str_cat("solve: the batch axis ", o.batch_axis, " is not an axis of the ", axes,
                               "-axis mesh: give 0 to ", axes - 1,
                               ", or -1 to leave the batch to the solver."));
    }
    tensor::Placements p(axes, tensor::Replicate());
    p[o.batch_axis] = tensor::Shard(0);
    for (const std::string& name : o.batch_inputs) pin_value(s.graph, s.record, name, p);
  }
  s.graph.problem.memory_budget = o.budget > 0 ? o.budget : std::numeric_limits<double>::infinity();
  t = std::chrono::steady_clock::now();
  s.solution = solve_sharding(s.graph.problem, o.solver);
  s.solve_s = since(t);
  if (group != nullptr) {
    share_choice(s.solution.choice, *group);  // (rank 0's time and memory too)
    s.solution.time_s = solution_time(s.graph.problem, s.solution.choice);
    s.solution.memory = solution_memory(s.graph.problem, s.solution.choice);
  }
  s.plan = step_plan(s.record, s.graph, s.solution.choice);
  return s;
}

}  // namespace dtrain::plan
