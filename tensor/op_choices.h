// Every way the sharding rules let one op run on a mesh (the whole-step sharding solver's candidates,
// plan/step_graph.h), where the DTensor handler keeps only the cheapest (tensor/dispatch.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/sharding_rules.h"

namespace dtrain::tensor {

struct OpChoices {
  std::vector<std::vector<int64_t>> output_shapes;  // global, one per returned tensor
  std::vector<Choice> choices;                      // inputs: one per DTensor argument, in argument order
};

// For one call of `op` with `args` as the handler receives them (DTensors at their global shapes, on any
// mesh), every combination of its rule's per-axis options on a mesh of `mesh_shape` that the rule can
// compute, the way the handler would take it there: plain tensors other than 0-d ones count as Replicate
// DTensors, and an op that writes its first argument keeps that argument's placements in its output.
// nullopt when the handler would not run the op by a rule: no rule, an op writing other arguments or
// writing a plain tensor, or outputs whose shapes cannot be known.
std::optional<OpChoices> op_choices(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                    const std::vector<int64_t>& mesh_shape);

}  // namespace dtrain::tensor
