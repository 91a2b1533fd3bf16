// The DTensor handler's side of ObserveOps (tensor/op_observer.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>

namespace dtrain::tensor::detail {

// Whether an observer is installed on this thread.
bool observing();

// Runs `handle` (the handler's work on `stack`) and, when it is a top-level op on an observing thread, shows
// the op, its arguments and its returns to the observer afterwards.
void observed(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::function<void()>& handle);

}  // namespace dtrain::tensor::detail
