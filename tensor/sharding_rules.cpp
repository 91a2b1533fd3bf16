// Sharding rules for pointwise ops (with broadcasting), matrix products, sums and transposes; see
// sharding_rules.h.
//
//   op                       per-axis options (inputs -> output)
//   pointwise, n-ary         all R -> R; for each output dim d: each input S(its aligned dim), or R where it
//                            broadcasts along d -> S(d)
//   mm(A, B)                 (R, R) -> R; (S0, R) -> S0; (R, S1) -> S1; (S1, S0) -> P(sum)
//   bmm(A, B)                (R, R) -> R; (S0, S0) -> S0 (batch); (S1, R) -> S1; (R, S2) -> S2; (S2, S1) ->
//   P(sum) addmm(C, A, B)           as mm, with C R when it broadcasts along the sharded dim, else sharded
//   like the output;
//                            P(sum) output needs C as P(sum)
//   sum(x), sum(x, dims)     R -> R; S(d) -> P(sum) when d is reduced, else S(d') (d' = d less the reduced
//   dims
//                            before it unless keepdim); P(sum) -> P(sum)
//   t(x), transpose(x,i,j)   R -> R; S(i) -> S(j), S(j) -> S(i), S(other) -> S(other); P -> P
//   detach, clone, alias     every placement to itself
//   *_like factories         R -> R, S(d) -> S(d), P -> R (only the shape is read)
//   view, _unsafe_view       R -> R, P -> P (sharded views need a dim mapping: they gather for now)
//   _to_copy (dtype casts)   every placement to itself
//   softmax, log_softmax     R -> R; S(d) -> S(d) for every d but the normalised dim (same for their
//   backward)
#include "tensor/sharding_rules.h"

#include <ATen/core/ivalue.h>

#include <map>

namespace dtrain::tensor {

namespace {

std::vector<AxisStrategy> pointwise_rule(const RuleCall& c) {
  const size_t n = c.input_shapes.size();
  const int64_t out_ndim = static_cast<int64_t>(c.output_shape.size());
  std::vector<AxisStrategy> s;
  s.push_back({std::vector<Placement>(n, Replicate()), Replicate()});
  for (int64_t d = 0; d < out_ndim; ++d) {
    AxisStrategy option{{}, Shard(static_cast<int>(d))};
    for (const auto& shape : c.input_shapes) {
      int64_t di = d - (out_ndim - static_cast<int64_t>(shape.size()));
      bool broadcast = di < 0 || shape[di] != c.output_shape[d];
      option.inputs.push_back(broadcast ? Replicate() : Shard(static_cast<int>(di)));
    }
    s.push_back(option);
  }
  return s;
}

std::vector<AxisStrategy> mm_rule(const RuleCall&) {
  return {{{Replicate(), Replicate()}, Replicate()},
          {{Shard(0), Replicate()}, Shard(0)},
          {{Replicate(), Shard(1)}, Shard(1)},
          {{Shard(1), Shard(0)}, Partial()}};
}

// bmm(A[b, m, k], B[b, k, n]): the batch dim shards both operands alike; otherwise as mm.
std::vector<AxisStrategy> bmm_rule(const RuleCall&) {
  return {{{Replicate(), Replicate()}, Replicate()},
          {{Shard(0), Shard(0)}, Shard(0)},
          {{Shard(1), Replicate()}, Shard(1)},
          {{Replicate(), Shard(2)}, Shard(2)},
          {{Shard(2), Shard(1)}, Partial()}};
}

std::vector<AxisStrategy> addmm_rule(const RuleCall& c) {
  // The bias broadcasts to [m, n]: shard it along a dim only where it is not broadcast.
  const auto& bias = c.input_shapes[0];
  auto bias_for = [&](int out_dim) {
    int64_t bi = out_dim - (2 - static_cast<int64_t>(bias.size()));
    bool broadcast = bi < 0 || bias[bi] != c.output_shape[out_dim];
    return broadcast ? Replicate() : Shard(static_cast<int>(bi));
  };
  return {{{Replicate(), Replicate(), Replicate()}, Replicate()},
          {{bias_for(0), Shard(0), Replicate()}, Shard(0)},
          {{bias_for(1), Replicate(), Shard(1)}, Shard(1)},
          {{Partial(), Shard(1), Shard(0)}, Partial()}};
}

// Reduced dims of a sum call (all dims when the op has no dim argument), and keepdim.
std::pair<std::vector<bool>, bool> sum_dims(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  std::vector<bool> reduced(ndim, true);
  const auto& args = *c.args;
  bool keepdim = args.size() >= 3 && args[2].isBool() && args[2].toBool();
  if (args.size() >= 3 &&
      args[1].isIntList()) {  // sum.dim_IntList; an empty or None dim list reduces everything
    auto dims = args[1].toIntList();
    if (dims.size() > 0) {
      reduced.assign(ndim, false);
      for (int64_t d : dims) reduced[d < 0 ? d + ndim : d] = true;
    }
  }
  return {reduced, keepdim};
}

std::vector<AxisStrategy> sum_rule(const RuleCall& c) {
  auto [reduced, keepdim] = sum_dims(c);
  std::vector<AxisStrategy> s{{{Replicate()}, Replicate()}, {{Partial()}, Partial()}};
  int64_t out_d = 0;
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (reduced[d]) {
      s.push_back({{Shard(static_cast<int>(d))}, Partial()});
      if (keepdim) ++out_d;
    } else {
      s.push_back({{Shard(static_cast<int>(d))}, Shard(static_cast<int>(out_d++))});
    }
  }
  return s;
}

std::vector<AxisStrategy> transpose_rule(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  int64_t i = 0, j = ndim > 1 ? 1 : 0;
  const auto& args = *c.args;
  if (args.size() >= 3 && args[1].isInt()) {
    i = args[1].toInt();
    j = args[2].toInt();
    if (i < 0) i += ndim;
    if (j < 0) j += ndim;
  }
  std::vector<AxisStrategy> s{{{Replicate()}, Replicate()}, {{Partial()}, Partial()}};
  for (int64_t d = 0; d < ndim; ++d) {
    int64_t to = d == i ? j : d == j ? i : d;
    s.push_back({{Shard(static_cast<int>(d))}, Shard(static_cast<int>(to))});
  }
  return s;
}

// Every input layout maps to itself: ops that copy, detach or alias without changing values or shape.
std::vector<AxisStrategy> identity_rule(const RuleCall& c) {
  std::vector<AxisStrategy> s{{{Replicate()}, Replicate()}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
    s.push_back({{Partial(op)}, Partial(op)});
  for (size_t d = 0; d < c.input_shapes[0].size(); ++d) {
    s.push_back({{Shard(static_cast<int>(d))}, Shard(static_cast<int>(d))});
  }
  return s;
}

// *_like factories read only the input's shape: a Partial input gives a Replicate output without any
// communication.
std::vector<AxisStrategy> like_rule(const RuleCall& c) {
  std::vector<AxisStrategy> s{{{Replicate()}, Replicate()}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
    s.push_back({{Partial(op)}, Replicate()});
  for (size_t d = 0; d < c.input_shapes[0].size(); ++d) {
    s.push_back({{Shard(static_cast<int>(d))}, Shard(static_cast<int>(d))});
  }
  return s;
}

// view/_unsafe_view take global sizes, which equal the block's only where nothing is sharded: Replicate and
// Partial keep their placement (a Partial's view is the view of each part); sharded views need a dim mapping
// (not yet).
std::vector<AxisStrategy> view_rule(const RuleCall&) {
  std::vector<AxisStrategy> s{{{Replicate()}, Replicate()}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    s.push_back({{Partial(op)}, Partial(op)});
  }
  return s;
}

// Ops that normalise along one dim (softmax, log_softmax and their backward, whose every tensor input has the
// output's shape): any other dim may stay sharded; the normalised dim must be whole. The dim is argument 1,
// or 2 for the backward ops (grad, output, dim, dtype).
std::vector<AxisStrategy> along_dim_rule(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.output_shape.size());
  const size_t n = c.input_shapes.size();
  int64_t dim = (*c.args)[n == 1 ? 1 : 2].toInt();
  if (dim < 0) dim += ndim;
  std::vector<AxisStrategy> s{{std::vector<Placement>(n, Replicate()), Replicate()}};
  for (int64_t d = 0; d < ndim; ++d) {
    if (d != dim)
      s.push_back({std::vector<Placement>(n, Shard(static_cast<int>(d))), Shard(static_cast<int>(d))});
  }
  return s;
}

}  // namespace

std::optional<Rule> find_rule(const std::string& op, bool pointwise) {
  static const std::map<std::string, Rule> rules{
      {"aten::mm", mm_rule},
      {"aten::addmm", addmm_rule},
      {"aten::bmm", bmm_rule},
      {"aten::sum", sum_rule},
      {"aten::sum.dim_IntList", sum_rule},
      {"aten::t", transpose_rule},
      {"aten::transpose.int", transpose_rule},
      {"aten::detach", identity_rule},
      {"aten::_to_copy", identity_rule},
      {"aten::_softmax", along_dim_rule},
      {"aten::_log_softmax", along_dim_rule},
      {"aten::_softmax_backward_data", along_dim_rule},
      {"aten::_log_softmax_backward_data", along_dim_rule},
      {"aten::view", view_rule},
      {"aten::_unsafe_view", view_rule},
      {"aten::clone", identity_rule},
      {"aten::alias", identity_rule},
      {"aten::ones_like", like_rule},
      {"aten::zeros_like", like_rule},
      {"aten::empty_like", like_rule},
      {"aten::full_like", like_rule},
  };
  auto it = rules.find(op);
  if (it != rules.end()) return it->second;
  if (pointwise) return Rule(pointwise_rule);
  return std::nullopt;
}

}  // namespace dtrain::tensor
