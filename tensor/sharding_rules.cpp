// The rule registry: every family adds its ops once (see sharding_rules.h and tensor/rules/).
#include "tensor/sharding_rules.h"

namespace dtrain::tensor {

namespace rules {

std::vector<AxisStrategy> identity_options(size_t ndim, size_t n_inputs) {
  std::vector<AxisStrategy> s{{std::vector<Placement>(n_inputs, Replicate()), Replicate()}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
    s.push_back({std::vector<Placement>(n_inputs, Partial(op)), Partial(op)});
  for (size_t d = 0; d < ndim; ++d) {
    s.push_back({std::vector<Placement>(n_inputs, Shard(static_cast<int>(d))), Shard(static_cast<int>(d))});
  }
  return s;
}

int64_t norm_dim(int64_t d, int64_t ndim) { return d < 0 ? d + ndim : d; }

}  // namespace rules

const RuleSpec* find_rule(const std::string& op, bool pointwise) {
  static const RuleTable table = [] {
    RuleTable t;
    rules::add_pointwise(t);
    rules::add_matrix(t);
    rules::add_reduction(t);
    rules::add_shape(t);
    rules::add_nn(t);
    return t;
  }();
  auto it = table.find(op);
  if (it != table.end()) return &it->second;
  // An out= overload ("aten::mm.out", "aten::mul.out") shares its functional form's rule.
  auto dot = op.rfind('.');
  if (dot != std::string::npos && op.find("out", dot) != std::string::npos) {
    for (const std::string& name : {op.substr(0, dot), op.substr(0, dot) + ".Tensor"}) {
      it = table.find(name);
      if (it != table.end()) return &it->second;
    }
  }
  if (pointwise) return &rules::pointwise_spec();
  return nullptr;
}

}  // namespace dtrain::tensor
