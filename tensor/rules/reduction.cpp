// Reductions, normalisations along a dim, and the negative log likelihood. See sharding_rules.h.
//
//   op                       per-axis options (inputs -> outputs)
//   sum(x[, dims])           R -> R; S(d) -> P(sum) when d is reduced, else S(d') (d' = d less the reduced
//   dims
//                            before it unless keepdim); P(sum/avg) -> the same P
//   mean(x[, dims])          as sum; a reduced S(d) -> P(sum) after scaling each block's mean by its share of
//                            the count (exact for uneven shards)
//   amax, amin               as sum, with P(max) / P(min) for a reduced S(d) and for P(max) / P(min) inputs;
//                            an empty block gives the reduction's identity (-inf / +inf)
//   var(x, dims, ...)        R -> R; S(d) -> S(d') for a dim d that is not reduced
//   softmax, log_softmax     R -> R; S(d) -> S(d) for every d but the normalised dim (same for their
//   backward) nll_loss_forward         all R -> R; logits [N, C] and targets S(0) -> loss P(sum) (mean: each
//   block's
//                            sum over the global weight total, one small all-reduce), total weight R
//   nll_loss_backward        grad R (mean, sum) or S(0) (none), logits and targets S(0), total weight R ->
//   S(0)
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <limits>

#include "tensor/detail/dtensor_meta.h"
#include "tensor/shard_math.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor::rules {

namespace {

// Reduced dims of a reduction (all dims when the op has no dim argument or an empty list), and keepdim.
std::pair<std::vector<bool>, bool> reduced_dims(const RuleCall& c, size_t dim_arg, size_t keepdim_arg) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  std::vector<bool> reduced(ndim, true);
  const auto& args = *c.args;
  bool keepdim = args.size() > keepdim_arg && args[keepdim_arg].isBool() && args[keepdim_arg].toBool();
  if (args.size() > dim_arg) {
    const auto& a = args[dim_arg];
    std::vector<int64_t> dims;
    if (a.isIntList()) dims = a.toIntVector();
    if (a.isInt()) dims = {a.toInt()};
    if (!dims.empty()) {
      reduced.assign(ndim, false);
      for (int64_t d : dims) reduced[norm_dim(d, ndim)] = true;
    }
  }
  return {reduced, keepdim};
}

// Options of a reduction: a reduced S(d) gives `on_reduced` (nullopt: not allowed); an unreduced S(d) keeps
// its shard; Partial inputs of the ops in `partials` pass through.
std::vector<AxisStrategy> reduction_options(const std::vector<bool>& reduced, bool keepdim,
                                            std::optional<Placement> on_reduced,
                                            std::initializer_list<ReduceOp> partials) {
  std::vector<AxisStrategy> s{{{Replicate()}, Replicate()}};
  for (ReduceOp op : partials) s.push_back({{Partial(op)}, Partial(op)});
  int64_t out_d = 0;
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (reduced[d]) {
      if (on_reduced) s.push_back({{Shard(static_cast<int>(d))}, *on_reduced});
      if (keepdim) ++out_d;
    } else {
      s.push_back({{Shard(static_cast<int>(d))}, Shard(static_cast<int>(out_d++))});
    }
  }
  return s;
}

// sum(x, dtype) and mean(x, dtype) reduce everything (their argument 1 is a dtype, not dims).
constexpr size_t kNoDims = 1000;

RuleResult sum_rule(const RuleCall& c, size_t dim_arg) {
  auto [reduced, keepdim] = reduced_dims(c, dim_arg, 2);
  return reduction_options(reduced, keepdim, Partial(), {ReduceOp::kSum, ReduceOp::kAvg});
}

RuleResult mean_rule(const RuleCall& c, size_t dim_arg) {
  auto [reduced, keepdim] = reduced_dims(c, dim_arg, 2);
  RuleResult r = reduction_options(reduced, keepdim, Partial(), {ReduceOp::kSum, ReduceOp::kAvg});
  std::vector<int64_t> shape = c.input_shapes[0];
  r.finish = [shape, reduced = reduced](std::vector<at::Tensor>& out, const Choice& choice,
                                        const MeshPtr& mesh) {
    bool split = false;
    for (const auto& p : choice.inputs[0]) split |= p.is_shard() && reduced[p.dim];
    if (!split) return;
    auto chunk = local_chunk(shape, mesh->shape(), choice.inputs[0], mesh->coordinate());
    int64_t local = 1, global = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (reduced[d]) {
        local *= chunk.shape[d];
        global *= shape[d];
      }
    }
    // This block's mean times its share of the count is its part of the global mean (0 for an empty block).
    out[0] = local == 0 ? at::zeros_like(out[0])
                        : out[0] * (static_cast<double>(local) / static_cast<double>(global));
  };
  return r;
}

RuleResult amax_rule(const RuleCall& c, ReduceOp op) {
  auto [reduced, keepdim] = reduced_dims(c, 1, 2);
  RuleResult r = reduction_options(reduced, keepdim, Partial(op), {op});
  // A block with no elements along a reduced dim (more ranks than rows) holds the reduction's identity
  // (-inf for max, +inf for min, the dtype's limits for integers), where libtorch's kernel would raise on
  // that rank only.
  r.run = [reduced = reduced, keepdim = keepdim, op](const c10::OperatorHandle& h, torch::jit::Stack& stack,
                                                     const Choice&, const MeshPtr&) {
    at::Tensor x = stack[0].toTensor();
    bool empty = false;
    for (size_t d = 0; d < reduced.size(); ++d) empty |= reduced[d] && x.size(static_cast<int64_t>(d)) == 0;
    if (!empty) return h.callBoxed(&stack);
    std::vector<int64_t> shape;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (!reduced[d]) shape.push_back(x.size(static_cast<int64_t>(d)));
      if (reduced[d] && keepdim) shape.push_back(1);
    }
    at::Tensor out = at::empty(shape, x.options());
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, x.scalar_type(), "reduction_identity",
                               [&] {
                                 using L = std::numeric_limits<scalar_t>;
                                 const bool inf = L::has_infinity;
                                 out.fill_(op == ReduceOp::kMax ? (inf ? -L::infinity() : L::lowest())
                                                                : (inf ? L::infinity() : L::max()));
                               });
    stack.clear();
    stack.emplace_back(out);
  };
  return r;
}

RuleResult var_rule(const RuleCall& c) {
  auto [reduced, keepdim] = reduced_dims(c, 1, 3);
  RuleResult r = reduction_options(reduced, keepdim, std::nullopt, {});
  std::vector<int64_t> out;  // var has no C++ meta kernel: its shape here
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (!reduced[d]) out.push_back(c.input_shapes[0][d]);
    if (reduced[d] && keepdim) out.push_back(1);
  }
  r.output_shapes = {out};
  return r;
}

// softmax, log_softmax and their backward (every tensor input has the output's shape): any other dim may stay
// sharded; the normalised dim must be whole. The dim is argument 1, or 2 for the backward ops.
RuleResult along_dim_rule(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.out_shape().size());
  const size_t n = c.input_shapes.size();
  int64_t dim = norm_dim((*c.args)[n == 1 ? 1 : 2].toInt(), ndim);
  std::vector<AxisStrategy> s{{std::vector<Placement>(n, Replicate()), Replicate()}};
  for (int64_t d = 0; d < ndim; ++d) {
    if (d != dim)
      s.push_back({std::vector<Placement>(n, Shard(static_cast<int>(d))), Shard(static_cast<int>(d))});
  }
  return s;
}

// nll_loss_forward(self [N, C] or [C], target, weight?, reduction, ignore_index) -> (output, total_weight)
RuleResult nll_forward_rule(const RuleCall& c) {
  const size_t n = c.input_shapes.size();  // self, target[, weight]
  const int64_t reduction = (*c.args)[3].toInt();
  std::vector<AxisStrategy> s{{std::vector<Placement>(n, Replicate()), {Replicate(), Replicate()}}};
  if (c.input_shapes[0].size() == 2) {
    std::vector<Placement> in(n, Replicate());
    in[0] = Shard(0);
    in[1] = Shard(0);
    s.push_back({in, {reduction == 0 ? Placement(Shard(0)) : Placement(Partial()), Replicate()}});
  }
  RuleResult r(std::move(s));
  r.output_shapes = {reduction == 0 ? std::vector<int64_t>{c.input_shapes[0][0]} : std::vector<int64_t>{},
                     std::vector<int64_t>{}};
  r.finish = [reduction](std::vector<at::Tensor>& out, const Choice& choice, const MeshPtr& mesh) {
    Placements parts;  // the block's total weight is a part of the global one on every axis splitting N
    bool split = false;
    for (const auto& p : choice.inputs[0]) {
      split |= p.is_shard();
      parts.push_back(p.is_shard() ? Placement(Partial()) : Placement(Replicate()));
    }
    if (!split) return;
    at::Tensor local_total = out[1];
    at::Tensor total = detail::to_local_raw(detail::redistribute_raw(
        detail::make_dtensor(local_total.clone(), mesh, parts, {}), Placements(parts.size(), Replicate())));
    if (reduction == 1) {  // mean: the block's sum over the global total
      out[0] = at::where(local_total > 0, out[0] * local_total, at::zeros_like(out[0])) / total;
    }
    out[1] = total;
  };
  return r;
}

// nll_loss_backward(grad, self, target, weight?, reduction, ignore_index, total_weight) -> grad_self
RuleResult nll_backward_rule(const RuleCall& c) {
  const size_t n = c.input_shapes.size();  // grad, self, target[, weight], total_weight
  const int64_t reduction = (*c.args)[4].toInt();
  std::vector<AxisStrategy> s{{std::vector<Placement>(n, Replicate()), Replicate()}};
  if (c.input_shapes[1].size() == 2) {
    std::vector<Placement> in(n, Replicate());
    if (reduction == 0) in[0] = Shard(0);
    in[1] = Shard(0);
    in[2] = Shard(0);
    s.push_back({in, Shard(0)});
  }
  RuleResult r(std::move(s));
  r.output_shapes = {c.input_shapes[1]};
  return r;
}

}  // namespace

void add_reduction(RuleTable& t) {
  t["aten::sum"] = {[](const RuleCall& c) { return sum_rule(c, kNoDims); }};
  t["aten::sum.dim_IntList"] = {[](const RuleCall& c) { return sum_rule(c, 1); }};
  t["aten::mean"] = {[](const RuleCall& c) { return mean_rule(c, kNoDims); }};
  t["aten::mean.dim"] = {[](const RuleCall& c) { return mean_rule(c, 1); }};
  t["aten::amax"] = {[](const RuleCall& c) { return amax_rule(c, ReduceOp::kMax); }};
  t["aten::amin"] = {[](const RuleCall& c) { return amax_rule(c, ReduceOp::kMin); }};
  t["aten::var.correction"] = {var_rule, true};
  for (const char* op : {"aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
                         "aten::_log_softmax_backward_data"}) {
    t[op] = {along_dim_rule};
  }
  t["aten::nll_loss_forward"] = {nll_forward_rule, true};
  t["aten::nll_loss_backward"] = {nll_backward_rule, true};
}

}  // namespace dtrain::tensor::rules
