// The rule registry: every family adds its ops once (see sharding_rules.h and tensor/rules/).
#include "tensor/sharding_rules.h"

#include <algorithm>

#include "core/error.h"

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

int64_t norm_dim(int64_t d, int64_t ndim) {
  // Rules read dims before libtorch's kernel validates them: check here, so bad input is a ValueError on
  // every rank rather than an out-of-bounds read.
  const int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor takes dim 0 or -1, as in libtorch
  if (d < -n || d >= n) {
    throw ValueError(str_cat("dim ", d, " is out of range for a tensor of ", ndim, " dims (valid: ", -n,
                             " to ", n - 1, "). Pass a dim in that range."));
  }
  return d < 0 ? d + n : d;
}

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
  if (pointwise) return &rules::pointwise_spec();
  return nullptr;
}

}  // namespace dtrain::tensor
