// FollowPlan; see follow_plan.h.
#include "tensor/follow_plan.h"

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dispatch_util.h"
#include "tensor/detail/observe.h"

namespace dtrain::tensor {

struct FollowPlan::State {
  const std::vector<PlannedOp>& ops;
  int64_t position = 0;  // ops of this step run so far
  int64_t steps = 0;
};

namespace {

thread_local std::shared_ptr<FollowPlan::State> t_plan;

}  // namespace

FollowPlan::FollowPlan(const std::vector<PlannedOp>& ops)
    : state_(std::make_shared<State>(State{ops})), previous_(std::move(t_plan)) {
  t_plan = state_;
}

FollowPlan::~FollowPlan() { t_plan = std::move(previous_); }

void FollowPlan::end_step() {
  State& s = *state_;
  if (s.position != static_cast<int64_t>(s.ops.size())) {
    const int64_t ran = s.position;
    s.position = 0;
    throw ValueError(str_cat(
        rank_prefix(), " DTensor: the step ended after ", ran, " ops, where the solved plan has ",
        s.ops.size(), " (the next would have been op #", ran, " ", s.ops[static_cast<size_t>(ran)].name,
        "). The step runs other ops than the one recorded: record and solve it again for what it runs now."));
  }
  s.position = 0;
  ++s.steps;
}

int64_t FollowPlan::position() const { return state_->position; }
int64_t FollowPlan::steps() const { return state_->steps; }

namespace detail {

bool following() { return t_plan != nullptr; }

const Choice* next_planned(const c10::OperatorHandle& op) {
  if (!t_plan || handler_depth() != 1) return nullptr;
  FollowPlan::State& s = *t_plan;
  const std::string name = op_name(op);
  if (s.position >= static_cast<int64_t>(s.ops.size())) {
    throw ValueError(
        str_cat(rank_prefix(), " DTensor: the step runs op #", s.position, " ", name,
                ", beyond the solved plan's ", s.ops.size(),
                " ops. End each step with FollowPlan::end_step(); if it did, the step runs other "
                "ops than the one recorded: record and solve it again."));
  }
  const PlannedOp& planned = s.ops[static_cast<size_t>(s.position)];
  if (planned.name != name) {
    throw ValueError(
        str_cat(rank_prefix(), " DTensor: op #", s.position, " of the step is ", name,
                ", where the solved plan has ", planned.name,
                ". The step runs other ops than the one recorded (a branch on the data, another "
                "batch shape, another optimizer?): record and solve it again for what it runs now."));
  }
  ++s.position;
  return &planned.choice;
}

int64_t planned_position() { return t_plan ? t_plan->position - 1 : -1; }

}  // namespace detail

}  // namespace dtrain::tensor
