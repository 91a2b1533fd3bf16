// step_plan and place_values; see step_plan.h.
#include "plan/step_plan.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "plan/detail/rank0_values.h"
#include "tensor/dtensor.h"

namespace dtrain::plan {

const tensor::Placements& StepPlan::placements(const std::string& name) const {
  std::string names;
  for (const auto& [n, p] : values) {
    if (n == name) return p;
    names += (names.empty() ? "" : ", ") + n;
  }
  throw ValueError(str_cat("the solved plan has no value named '", name, "'; it places ",
                           names.empty() ? std::string("no named value") : names,
                           ". Name the tensor when recording the step (record_step's named tensors)."));
}

StepPlan step_plan(const StepRecord& record, const StepGraph& g, const std::vector<int>& choice) {
  if (choice.size() != g.problem.nodes.size()) {
    throw ValueError(str_cat("step_plan: ", choice.size(), " choices for a graph of ", g.problem.nodes.size(),
                             " nodes: pass the solver's solution for this graph."));
  }
  StepPlan plan;
  for (size_t i = 0; i < record.ops.size(); ++i) {
    const RecordedOp& op = record.ops[i];
    const int n = g.node_of_op[i];
    DTRAIN_ASSERT(n >= 0 && choice[n] >= 0 && choice[n] < static_cast<int>(op.choices.size()), "op #", i, " ",
                  op.name, " has no solved choice");
    plan.ops.push_back({op.name, op.choices[choice[n]]});
  }
  // A value written in place reaches its writer in the placements it has (the solver's forbidden edges).
  for (size_t i = 0; i < record.ops.size(); ++i) {
    const RecordedOp& op = record.ops[i];
    for (size_t k = 0; k < op.choice_inputs.size(); ++k) {
      const int v = op.inputs[op.choice_inputs[k]];
      if (!writes(record, static_cast<int>(i), v)) continue;
      const tensor::Placements& has = g.placement(record, v, choice[g.source(record, v)]);
      if (has != plan.ops[i].choice.inputs[k]) {
        throw ValueError(str_cat(
            "step_plan: op #", i, " ", op.name, " writes a tensor in place under ",
            tensor::to_string(plan.ops[i].choice.inputs[k]), " that the plan has at ", tensor::to_string(has),
            "; a tensor written in place keeps its placements. The solution is not one the "
            "solver gives for this graph (its time is at least ",
            kForbidden_s, " s): pass the solver's own."));
      }
    }
  }
  std::vector<bool> written(record.values.size(), false);
  for (const RecordedValue& v : record.values) {
    if (v.previous >= 0) written[v.previous] = true;
  }
  for (int v : record.outside_values()) {
    const int n = g.node_of_value[v];
    const tensor::Placements& p = g.placements[n][choice[n]];
    const RecordedValue& value = record.values[v];
    if (!value.name.empty()) {
      plan.values.emplace_back(value.name, p);
      continue;
    }
    if (written[v] && tensor::to_string(p) != value.placements) {
      int reader = 0;
      while (reader < static_cast<int>(record.ops.size()) &&
             std::find(record.ops[reader].inputs.begin(), record.ops[reader].inputs.end(), v) ==
                 record.ops[reader].inputs.end())
        ++reader;
      throw ValueError(str_cat(
          "step_plan: a tensor of shape ", c10::IntArrayRef(value.sizes),
          " from outside the step (first read by op #", reader, " ", record.ops[reader].name,
          ") is written by the step, and the plan moves it from ", value.placements, " to ",
          tensor::to_string(p),
          ", but it has no name, so it cannot be put there. Name it when recording (the optimizer's state: "
          "plan::optimizer_state), or pin it to ",
          value.placements, "."));
    }
  }
  return plan;
}

void share_choice(std::vector<int>& choice, comm::Backend& group) {
  std::vector<double> values(choice.begin(), choice.end());  // (option indices: exact as doubles)
  detail::take_rank0_values(values, group, "share_choice", "nodes in the solved graph",
                            "the ranks recorded different steps. Record the same step on every rank.");
  for (size_t i = 0; i < values.size(); ++i) choice[i] = static_cast<int>(values[i]);
}

int place_values(const StepPlan& plan, const NamedTensors& tensors) {
  c10::AutoGradMode no_grad(false);
  int placed = 0;
  for (const auto& [name, t] : tensors) {
    for (const auto& [n, p] : plan.values) {
      if (n != name) continue;
      if (!t.defined() || !tensor::is_dtensor(t)) {
        throw ValueError(
            str_cat("place_values: '", name,
                    "' is not a DTensor; distribute the module (and make the optimizer's state) on "
                    "the mesh before placing its values by the plan."));
      }
      if (tensor::placements_of(t) != p) {
        at::Tensor moved = tensor::redistribute(t, p);
        at::Tensor target = t;  // (set_data on the caller's tensor: every holder of it sees the move)
        target.set_data(moved);
      }
      ++placed;
      break;
    }
  }
  return placed;
}

}  // namespace dtrain::plan
