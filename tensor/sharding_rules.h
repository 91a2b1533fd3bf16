// Sharding rules (DESIGN §4): for an op, the ways it can run on local blocks, per mesh axis. A rule lists
// AxisStrategy options (the placement each DTensor input must have on one axis, and each output's placement
// there); the handler combines one option per axis, prices each combination by the redistribution its inputs
// need, and runs the cheapest. Rules live one family per file in tensor/rules/; this header is their common
// language and the registry.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tensor/dtensor.h"
#include "tensor/placement.h"

namespace dtrain::tensor {

struct AxisStrategy {
  AxisStrategy(std::vector<Placement> in, Placement out) : inputs(std::move(in)), outputs{out} {}
  AxisStrategy(std::vector<Placement> in, std::vector<Placement> out)
      : inputs(std::move(in)), outputs(std::move(out)) {}
  std::vector<Placement> inputs;   // one per DTensor argument, in argument order (tensor lists flattened)
  std::vector<Placement> outputs;  // one per returned Tensor; a returned Tensor[] has one for all its tensors
};

// What a rule sees of a call: the global shapes of the DTensor arguments (in argument order; plain tensors
// are implicitly Replicate DTensors by then), the outputs' global shapes when the handler could infer them
// (the broadcast shape for pointwise ops, else the op's meta kernel; empty otherwise), the op's arguments
// (for dims and flags) and the mesh's shape.
struct RuleCall {
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<std::vector<int64_t>> output_shapes;
  const torch::jit::Stack* args = nullptr;  // the op's arguments, first at index 0
  std::vector<int64_t> mesh_shape;
  // Argument `i`'s index among the DTensor arguments, or -1 when it is not one (a 0-d plain tensor, which
  // stays a scalar; an undefined optional tensor; a non-tensor argument).
  std::vector<int> dtensor_index;

  // The DTensor index of argument `i` (-1: not a DTensor). Rules that treat arguments differently (div's
  // numerator, sub's first operand) use it: input_shapes lists DTensors only.
  int dtensor_at(size_t i) const { return i < dtensor_index.size() ? dtensor_index[i] : -1; }

  const std::vector<int64_t>& out_shape() const { return output_shapes.at(0); }
};

// A chosen combination: the placements of every input and output over all mesh axes.
struct Choice {
  std::vector<Placements> inputs;
  std::vector<Placements> outputs;
};

struct RuleResult {
  RuleResult(std::vector<AxisStrategy> o) : options(std::move(o)) {}  // NOLINT: rules return option lists
  std::vector<AxisStrategy> options;
  // The outputs' global shapes, for ops whose shapes the handler cannot infer (no meta kernel in C++).
  std::vector<std::vector<int64_t>> output_shapes;
  // With output_shapes, optional: their global strides as libtorch's kernel lays the outputs out on one
  // process, where that is not contiguous (empty: contiguous). Later ops decide by them (a reshape views or
  // copies, contiguous() copies or not), so a DTensor must carry the strides the plain tensor would.
  std::vector<std::vector<int64_t>> output_strides;
  // Optional: false for a combination the local op cannot compute (checked by the rule for every
  // coordinate, so every rank decides alike).
  std::function<bool(const Choice&)> valid;
  // Optional: rewrites the op's arguments for this rank's blocks (global sizes to local ones, a diagonal
  // offset by the block's position, ...). `coordinate` is this rank's mesh coordinate.
  std::function<void(torch::jit::Stack& args, const Choice&, const std::vector<int64_t>& coordinate)>
      localize;
  // Optional: runs the op on the blocks instead of the op's kernel (args already local; leaves the outputs on
  // the stack, as callBoxed would).
  std::function<void(const c10::OperatorHandle& op, torch::jit::Stack& stack, const Choice&,
                     const MeshPtr& mesh)>
      run;
  // Optional: adjusts the local outputs after the op ran (e.g. a mean's division by the global count). May
  // communicate over `mesh`.
  std::function<void(std::vector<at::Tensor>& outputs, const Choice&, const MeshPtr& mesh)> finish;
};

using Rule = std::function<RuleResult(const RuleCall&)>;

struct RuleSpec {
  Rule rule;
  bool gives_shapes = false;  // the rule sets RuleResult::output_shapes itself: no meta kernel call
  // Run by the rule even when every input is Replicate (whose blocks otherwise run the op as they are):
  // random ops, whose values come from DTensor's stream rather than each rank's generator.
  bool always = false;
};

using RuleTable = std::map<std::string, RuleSpec>;

// The rule for an op ("aten::mm", "aten::sum.dim_IntList", ...), or nullptr. `pointwise` says whether the op
// carries the pointwise tag (one rule serves them all). An out= op is looked up by its functional form's name
// (the handler finds it from the schema).
const RuleSpec* find_rule(const std::string& op, bool pointwise);

// The families (tensor/rules/*.cpp) add their ops to the table.
namespace rules {
void add_pointwise(RuleTable& t);  // pointwise, identity, *_like, dropout
void add_matrix(RuleTable& t);     // mm, addmm, bmm, scaled dot product attention
void add_reduction(RuleTable& t);  // sum, mean, amax/amin, var, softmax family, nll_loss
void add_shape(RuleTable& t);      // view/reshape, transpose, permute, (un)squeeze, split, cat, slice, ...
void add_nn(RuleTable& t);         // layer_norm, embedding
// Helpers shared by the families.
std::vector<AxisStrategy> identity_options(size_t ndim, size_t n_inputs = 1);
// `d` in [0, ndim): a negative dim counts from the end. ValueError when it is out of range.
int64_t norm_dim(int64_t d, int64_t ndim);
const RuleSpec& pointwise_spec();
}  // namespace rules

}  // namespace dtrain::tensor
