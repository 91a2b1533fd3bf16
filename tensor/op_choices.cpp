// op_choices; see op_choices.h.
#include "tensor/op_choices.h"

#include <ATen/ATen.h>

#include "tensor/detail/dispatch_util.h"
#include "tensor/detail/rule_plan.h"

namespace dtrain::tensor {

std::optional<OpChoices> op_choices(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                    const std::vector<int64_t>& mesh_shape) {
  const auto& schema = op.schema();
  torch::jit::Stack stack(args);
  MeshPtr mesh;
  detail::for_each_tensor(stack, stack.size(), [&](const at::Tensor& t, size_t) {
    if (!mesh && t.defined() && is_dtensor(t)) mesh = detail::meta_of(t).mesh;
    return at::Tensor();
  });
  if (!mesh) return std::nullopt;
  // As the handler takes them: written arguments, plain ones (a plain tensor written is not run by a rule).
  size_t written = 0;
  for (const auto& a : schema.arguments()) written += a.alias_info() != nullptr && a.alias_info()->isWrite();
  bool plain_written = false;
  detail::for_each_tensor(stack, stack.size(), [&](const at::Tensor& t, size_t i) {
    if (!t.defined() || is_dtensor(t) || t.dim() == 0) return at::Tensor();
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      plain_written = true;
      return at::Tensor();
    }
    return detail::make_dtensor(t, mesh, Placements(mesh->ndim(), Replicate()), t.sizes().vec(), t.strides());
  });
  std::vector<std::pair<size_t, at::Tensor>> dts;
  detail::for_each_tensor(stack, stack.size(), [&](const at::Tensor& t, size_t i) {
    if (t.defined() && is_dtensor(t)) dts.emplace_back(i, t);
    return at::Tensor();
  });
  const bool in_place = written == 1 && !dts.empty() && dts[0].first == 0 && schema.returns().size() == 1 &&
                        schema.arguments()[0].alias_info() != nullptr &&
                        schema.arguments()[0].alias_info()->isWrite();
  const RuleSpec* spec = detail::rule_of(op);
  if (spec == nullptr || plain_written || (written > 0 && !in_place)) return std::nullopt;

  RuleCall call;
  call.mesh_shape = mesh_shape;
  for (auto& [i, t] : dts) call.input_shapes.push_back(t.sizes().vec());
  call.args = &stack;
  call.dtensor_index.assign(stack.size(), -1);
  for (size_t k = 0; k < dts.size(); ++k) {
    if (call.dtensor_index[dts[k].first] < 0) call.dtensor_index[dts[k].first] = static_cast<int>(k);
  }
  if (!spec->gives_shapes) {
    call.output_shapes = detail::infer_outputs(op, stack, dts).shapes;
    if (call.output_shapes.empty()) return std::nullopt;
  }
  const RuleResult res = spec->rule(call);
  if (res.options.empty()) return std::nullopt;
  OpChoices out;
  out.output_shapes = spec->gives_shapes ? res.output_shapes : call.output_shapes;
  // Which returned tensors each return's placement covers (a Tensor[] return covers many).
  const size_t n_ret = schema.returns().size();
  std::vector<size_t> first_of{0};
  for (size_t r = 0; r < n_ret; ++r) {
    size_t count = 1;
    if (schema.returns()[r].type()->kind() == c10::TypeKind::ListType)
      count = out.output_shapes.size() - (n_ret - 1);
    first_of.push_back(first_of.back() + count);
  }
  if (res.options[0].outputs.size() != n_ret || first_of.back() != out.output_shapes.size())
    return std::nullopt;
  detail::for_each_choice(op, res, dts.size(), out.output_shapes, first_of,
                          static_cast<int>(mesh_shape.size()), nullptr, [&](const Choice& ch) {
                            if (in_place && ch.inputs[0] != ch.outputs[0]) return;
                            out.choices.push_back(ch);
                          });
  if (out.choices.empty()) return std::nullopt;
  return out;
}

}  // namespace dtrain::tensor
