// Running a step by a solved plan (issue 32; docs/planning.md, "Executing a solved step"): while a
// FollowPlan is alive on a thread, the DTensor handler takes each top-level op's placements from the plan, by
// the op's position in the step, instead of choosing the cheapest for that op alone. The plan is a list of
// ops as a recorded step ran them (plan/step_record.h) with the placements the whole-step solver chose for
// each (plan/step_plan.h builds it). An op whose name differs from the plan's at its position, a step that
// runs more or fewer ops than the plan has, and placements the op's rule does not allow for the arguments it
// got are each an error naming the position and the ops: the handler never falls back to its own choice.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/sharding_rules.h"

namespace dtrain::tensor {

struct PlannedOp {
  std::string name;  // "aten::addmm", "aten::add_.Tensor" (the operator and its overload)
  // Its DTensor arguments' placements (plain tensors other than 0-d ones count, as Replicate DTensors do),
  // in argument order, and its returns' (a tensor list's return: one placement for every tensor in it).
  Choice choice;
};

// Installs `ops` (which must outlive it) for this thread for its lifetime (a FollowPlan made while another
// is alive replaces it until it ends). The ops of forward, backward and the optimizer's step are followed
// when they run on this thread (with backward on the CPU, the caller's thread runs it). Every op on a DTensor
// counts, so make the step's inputs before it, and end its scope (or call end_step()) where the step ends:
//   at::Tensor x = distribute_tensor(batch, mesh, plan.placements("x"));
//   { FollowPlan follow(plan.ops); loss(x).backward(); opt.step(); follow.end_step(); }
class FollowPlan {
 public:
  explicit FollowPlan(const std::vector<PlannedOp>& ops);
  ~FollowPlan();
  FollowPlan(const FollowPlan&) = delete;
  FollowPlan& operator=(const FollowPlan&) = delete;

  // Ends a step: every op of the plan must have run (ValueError naming the first that did not). The next op
  // is the plan's first again.
  void end_step();
  // The ops of the current step run so far, and the steps ended.
  int64_t position() const;
  int64_t steps() const;

  struct State;

 private:
  std::shared_ptr<State> state_, previous_;
};

}  // namespace dtrain::tensor
