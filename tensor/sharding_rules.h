// Sharding rules (DESIGN §4): for an op, the ways it can run on local blocks, per mesh axis. A rule lists
// AxisStrategy options (the placement each DTensor input must have on one axis, and the output's placement
// there); the handler combines one option per axis, prices each combination by the redistribution its inputs
// need, and runs the cheapest. One family per function below; more families join as files of their own.
#pragma once

#include <ATen/core/stack.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensor/placement.h"

namespace dtrain::tensor {

struct AxisStrategy {
  std::vector<Placement> inputs;  // one per DTensor argument, in argument order
  Placement output;
};

// What a rule sees of a call: the global shapes of the DTensor arguments (in argument order), the output's
// global shape, and the op's arguments (for dims and flags).
struct RuleCall {
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<int64_t> output_shape;
  const torch::jit::Stack* args = nullptr;  // the op's arguments, first at index 0
};

using Rule = std::function<std::vector<AxisStrategy>(const RuleCall&)>;

// The rule for an op ("aten::mm", "aten::sum.dim_IntList", ...), or nullopt. `pointwise` says whether the op
// carries the pointwise tag (one rule serves them all).
std::optional<Rule> find_rule(const std::string& op, bool pointwise);

}  // namespace dtrain::tensor
