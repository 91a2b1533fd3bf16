// Watching the ops that DTensor's dispatcher handles (plan/step_record.h records a training step with it).
// While an ObserveOps is alive on a thread, every aten op that reaches the DTensor handler from that thread
// at the top level (not the ops the handler itself runs on DTensors while handling one) is shown to the
// observer after it ran: its name, its arguments as they were passed and its returns. The thread that runs
// backward on CPU is the caller's, so one observer sees forward, backward and the optimizer's step.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <vector>

namespace dtrain::tensor {

// op: the operator (its schema says which arguments it writes); arguments: as the op received them;
// returns: what it returned (DTensors; in place, the written argument itself); seconds: the handler's time
// on it (wall clock).
using OpObserver =
    std::function<void(const c10::OperatorHandle& op, const std::vector<c10::IValue>& arguments,
                       const std::vector<c10::IValue>& returns, double seconds)>;

// Installs `observer` for this thread for its lifetime (the previous one, if any, comes back after it).
class ObserveOps {
 public:
  explicit ObserveOps(OpObserver observer);
  ~ObserveOps();
  ObserveOps(const ObserveOps&) = delete;
  ObserveOps& operator=(const ObserveOps&) = delete;

 private:
  OpObserver previous_;
};

}  // namespace dtrain::tensor
