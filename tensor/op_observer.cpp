// ObserveOps; see op_observer.h.
#include "tensor/op_observer.h"

#include "tensor/detail/observe.h"

#include <chrono>

namespace dtrain::tensor {

namespace {

thread_local OpObserver t_observer;
thread_local int t_depth = 0;  // ops being handled on this thread (1: a top-level op)

struct Depth {
  Depth() { ++t_depth; }
  ~Depth() { --t_depth; }
};

}  // namespace

ObserveOps::ObserveOps(OpObserver observer) : previous_(std::move(t_observer)) {
  t_observer = std::move(observer);
}

ObserveOps::~ObserveOps() { t_observer = std::move(previous_); }

namespace detail {

bool observing() { return static_cast<bool>(t_observer); }

int handler_depth() { return t_depth; }

void observed(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::function<void()>& handle) {
  if (t_depth > 0) {  // an op the handler runs while handling another: not the step's own
    Depth d;
    handle();
    return;
  }
  const size_t n_args = op.schema().arguments().size();
  std::vector<c10::IValue> args;
  if (t_observer) args.assign(stack->end() - static_cast<std::ptrdiff_t>(n_args), stack->end());
  Depth d;  // (held while the observer runs too: what it does on DTensors is not the step's)
  const auto start = std::chrono::steady_clock::now();
  handle();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t n_ret = op.schema().returns().size();
  std::vector<c10::IValue> rets(stack->end() - static_cast<std::ptrdiff_t>(n_ret), stack->end());
  if (!t_observer) return;           // (following a plan without observing)
  OpObserver observer = t_observer;  // (the observer may install another)
  observer(op, args, rets, seconds);
}

}  // namespace detail

}  // namespace dtrain::tensor
