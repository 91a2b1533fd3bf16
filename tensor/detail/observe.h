// The DTensor handler's side of ObserveOps (tensor/op_observer.h) and FollowPlan (tensor/follow_plan.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>

#include "tensor/sharding_rules.h"

namespace dtrain::tensor::detail {

// Whether an observer or a plan to follow is installed on this thread.
bool observing();
bool following();

// Runs `handle` (the handler's work on `stack`) and, when it is a top-level op on an observing thread, shows
// the op, its arguments and its returns to the observer afterwards. Keeps the depth of ops being handled.
void observed(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::function<void()>& handle);

// Ops being handled on this thread now (1 while the handler works on a top-level op).
int handler_depth();

// For the handler at the start of a top-level op while a plan is followed: the op's planned placements (the
// position moves on). Nullptr when no plan is followed or the op is not a top-level one. ValueError when the
// op is not the one the plan has at its position, or the plan has no more ops.
const Choice* next_planned(const c10::OperatorHandle& op);

// The position of the op next_planned last returned, and the plan's name for it, for errors.
int64_t planned_position();

}  // namespace dtrain::tensor::detail
