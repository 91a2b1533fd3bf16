// optimizer_state and init_optimizer_state; see optimizer_state.h.
#include "plan/optimizer_state.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "core/error.h"

namespace dtrain::plan {

namespace {

template <class F>
void for_each_param(const torch::optim::Optimizer& opt, F&& f) {
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) f(group, p);
  }
}

std::string kind_of(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return "SGD";
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) return "Adam";
  return "";
}

// Adam's or AdamW's state before its first step: zeros like the parameter, step 0.
template <class State, class Options>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(const at::Tensor& p,
                                                              const torch::optim::OptimizerOptions& options) {
  auto s = std::make_unique<State>();
  s->step(0);
  s->exp_avg(at::zeros_like(p));
  s->exp_avg_sq(at::zeros_like(p));
  if (static_cast<const Options&>(options).amsgrad()) s->max_exp_avg_sq(at::zeros_like(p));
  return s;
}

}  // namespace

NamedTensors optimizer_state(const torch::optim::Optimizer& opt, const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) {
    auto it = opt.state().find(p.unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    const auto* state = it->second.get();
    auto add = [&, n = name](const char* what, const at::Tensor& t) {
      if (t.defined()) out.emplace_back(n + ":" + what, t);
    };
    if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      add("momentum_buffer", s->momentum_buffer());
    } else if (const auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      add("exp_avg", a->exp_avg());
      add("exp_avg_sq", a->exp_avg_sq());
      add("max_exp_avg_sq", a->max_exp_avg_sq());
    } else if (const auto* b = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      add("exp_avg", b->exp_avg());
      add("exp_avg_sq", b->exp_avg_sq());
      add("max_exp_avg_sq", b->max_exp_avg_sq());
    } else {
      throw NotSupportedError(
          str_cat("optimizer_state: the state of parameter '", name,
                  "' is of an optimizer other than SGD, Adam and AdamW, whose state "
                  "tensors dtrain does not know yet. Use one of those to plan the step."));
    }
  }
  return out;
}

void init_optimizer_state(torch::optim::Optimizer& opt) {
  const std::string kind = kind_of(opt);
  if (kind.empty()) {
    throw NotSupportedError(
        "init_optimizer_state: only SGD, Adam and AdamW are known; the state of another optimizer cannot be "
        "made before its first step. Use one of those to plan the step.");
  }
  c10::AutoGradMode no_grad(false);
  auto& state = opt.state();
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      void* key = p.unsafeGetTensorImpl();
      if (state.count(key)) continue;
      if (kind == "SGD") {
        const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
        if (o.momentum() == 0) continue;  // (no state)
        if (o.dampening() != 0) {
          throw NotSupportedError(str_cat(
              "init_optimizer_state: SGD with dampening ", o.dampening(),
              " skips the dampening at its first step, which a step with momentum buffers made beforehand "
              "cannot do. Plan with dampening 0, or run one step before recording and following the plan."));
        }
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(at::zeros_like(p));
        state[key] = std::move(s);
      } else if (kind == "AdamW") {
        state[key] =
            adam_state<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(p, group.options());
      } else {
        state[key] = adam_state<torch::optim::AdamParamState, torch::optim::AdamOptions>(p, group.options());
      }
    }
  }
}

}  // namespace dtrain::plan
