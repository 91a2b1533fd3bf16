// Planning one call of an op by its sharding rule, for the DTensor handler (tensor/dispatch.cpp): the
// outputs' global geometry from the op's meta kernel, the cheapest combination of the rule's per-axis
// options, and a per-thread cache of those decisions.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "tensor/sharding_rules.h"

namespace dtrain::tensor::detail {

// The outputs' global shapes and strides, as libtorch lays them out on one process: from the op's meta
// kernel on meta tensors of the inputs' global shapes and strides. Empty when the op has no meta kernel in
// C++; then a pointwise op's shape is its inputs' broadcast, dense in its first input's dim order. A meta
// kernel's own error (a view of a tensor whose strides do not allow it, a bad dim) is libtorch's answer for
// the global tensor and is raised on every rank alike.
struct Outputs {
  std::vector<std::vector<int64_t>> shapes, strides;
  std::vector<int64_t> offsets;  // storage offsets: a view's place in its input's global layout
};

Outputs infer_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                      const std::vector<std::pair<size_t, at::Tensor>>& dts);

// Calls `f` with every combination of one of `res`'s options per mesh axis (of `axes`) that is valid: each
// output's placements fit its shape (`shapes`, returns r covering [first_of[r], first_of[r + 1])), the rule
// can compute it, and, for an op writing its first argument (`in_place` not null), the first input and the
// output keep `*in_place`.
void for_each_choice(const c10::OperatorHandle& op, const RuleResult& res, size_t n_inputs,
                     const std::vector<std::vector<int64_t>>& shapes, const std::vector<size_t>& first_of,
                     int axes, const Placements* in_place, const std::function<void(const Choice&)>& f);

// The op's rule (or nullptr), looked up once per op; an out= op takes its functional form's rule.
const RuleSpec* rule_of(const c10::OperatorHandle& op);

// A rule's decision for one call: the hooks, the outputs' global shapes, which returned tensors each output
// placement covers (a Tensor[] return has many: [first_of[r], first_of[r + 1])), and the chosen placements.
struct RulePlan {
  RuleResult res;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<int64_t>> strides;  // empty for an output: contiguous
  std::vector<int64_t> offsets;               // global storage offsets (views)
  std::vector<size_t> first_of;
  Choice best;
  std::vector<Choice> choices;  // every valid one (a solved plan's choice must be among them)
};

// Plans per (op, arguments' specs) once: later calls with the same key reuse the decision (nullptr: the rule
// does not apply). Per thread (the backward pass may run on autograd's threads); bounded. Shared pointers, so
// a plan in use survives the cache being cleared by a nested call.
// `in_place`: the op writes its first argument (a DTensor, dts[0]), which keeps its placements. `out_index`:
// the out= argument's index, or -1. `base`: the stack index of args[0] (dts hold stack indices).
std::shared_ptr<const RulePlan> cached_plan(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                            const RuleSpec& spec,
                                            const std::vector<std::pair<size_t, at::Tensor>>& dts,
                                            const MeshPtr& mesh, bool in_place, int out_index, size_t base);

}  // namespace dtrain::tensor::detail
