// A torch::optim optimizer's per-parameter state as named tensors, and that state made before the first step,
// for recording and following a solved step (plan/step_plan.h): the step recorded is a steady one, in which
// the state exists, so the state must exist before the first step that follows the plan.
#pragma once

#include <torch/optim/optimizer.h>

#include "plan/step_record.h"

namespace dtrain::plan {

// The state tensors of the parameters of `params`, named "<parameter>:<state>" ("fc.weight:exp_avg"). Knows
// SGD (momentum_buffer), Adam and AdamW (exp_avg, exp_avg_sq, max_exp_avg_sq); another optimizer with state
// is a NotSupportedError naming it.
NamedTensors optimizer_state(const torch::optim::Optimizer& opt, const NamedTensors& params);

// Makes the state each parameter of `opt` would get at its first step, as it is before that step's update:
// zeros in the parameter's placements, step 0. The next step then computes what a first step computes, as
// the steady step's ops do. SGD with momentum and no dampening, Adam and AdamW; an SGD with dampening (whose
// first step skips it) or another optimizer is a NotSupportedError saying so. Parameters that have state
// keep it.
void init_optimizer_state(torch::optim::Optimizer& opt);

}  // namespace dtrain::plan
