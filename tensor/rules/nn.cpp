// Layer norm and embedding. See sharding_rules.h.
//
//   op                           per-axis options (inputs -> outputs)
//   native_layer_norm(x, w, b)   all R -> R; x S(d) for a dim d before the normalised ones, w and b R ->
//                                (out, mean, rstd) S(d)
//   native_layer_norm_backward   all R -> R; grad, x, mean, rstd S(d), w and b R -> (S(d), P(sum), P(sum));
//     (grad, x, mean, rstd, w, b)  grad P, the rest R -> P (the backward is linear in grad)
//   embedding(weight, ids)       (R, R) -> R; (R, S(d)) -> S(d); (S(1), R) -> S(last); (P, R) -> P;
//                                (S(0), R) -> P(sum): vocab parallel, each rank's rows by a masked lookup
//   embedding_dense_backward     (R, R) -> R; (S(d), S(d)) -> P(sum) for an ids dim d; (S(last), R) -> S(1);
//     (grad, ids)                (P, R) -> P. With scale_grad_by_freq the counts are global: R only. (A
//                                vocab-sharded weight gets a Replicate gradient; its optimizer step slices
//                                it.)
#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"

#include "tensor/shard_math.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor::rules {

namespace {

// The first normalised dim of `x`. ValueError when `normalized` is not x's trailing dims (checked before any
// index is read; libtorch's kernel would say the same, but only after the rule ran).
int64_t normalized_axis(const std::vector<int64_t>& x, const std::vector<int64_t>& normalized) {
  if (normalized.empty() || normalized.size() > x.size() ||
      !std::equal(normalized.begin(), normalized.end(),
                  x.end() - static_cast<std::ptrdiff_t>(normalized.size()))) {
    throw ValueError(str_cat("layer_norm: normalized_shape ", c10::IntArrayRef(normalized),
                             " is not the trailing dims of an input of shape ", c10::IntArrayRef(x),
                             ". Pass the input's last dims, e.g. ",
                             x.empty() ? "[]" : str_cat("[", x.back(), "]"), "."));
  }
  return static_cast<int64_t>(x.size() - normalized.size());
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
RuleResult layer_norm_rule(const RuleCall& c) {
  const size_t n = c.input_shapes.size();
  const auto& x = c.input_shapes[0];
  const int64_t axis = normalized_axis(x, (*c.args)[1].toIntVector());
  std::vector<AxisStrategy> s{
      {std::vector<Placement>(n, Replicate()), std::vector<Placement>(3, Replicate())}};
  for (int64_t d = 0; d < axis; ++d) {
    std::vector<Placement> in(n, Replicate());
    in[0] = Shard(static_cast<int>(d));
    s.push_back({in, std::vector<Placement>(3, Shard(static_cast<int>(d)))});
  }
  RuleResult r(std::move(s));
  std::vector<int64_t> stats(x.begin(), x.begin() + axis);
  stats.resize(x.size(), 1);
  r.output_shapes = {x, stats, stats};
  return r;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
//   -> (grad_input, grad_weight, grad_bias)
RuleResult layer_norm_backward_rule(const RuleCall& c) {
  const size_t n = c.input_shapes.size();
  const auto& x = c.input_shapes[1];
  std::vector<int64_t> normalized = (*c.args)[2].toIntVector();
  const int64_t axis = normalized_axis(x, normalized);
  std::vector<AxisStrategy> s{
      {std::vector<Placement>(n, Replicate()), std::vector<Placement>(3, Replicate())}};
  for (int64_t d = 0; d < axis; ++d) {
    std::vector<Placement> in(n, Replicate());
    for (size_t k = 0; k < 4; ++k) in[k] = Shard(static_cast<int>(d));
    s.push_back({in, {Shard(static_cast<int>(d)), Partial(), Partial()}});
  }
  {
    std::vector<Placement> in(n, Replicate());
    in[0] = Partial();
    s.push_back({in, {Partial(), Partial(), Partial()}});
  }
  RuleResult r(std::move(s));
  r.output_shapes = {x, normalized, normalized};
  return r;
}

// This rank's rows of a vocab-sharded (Shard(0)) weight: [offset, offset + size); 0 rows when dim 0 is whole.
std::pair<int64_t, int64_t> vocab_rows(const std::vector<int64_t>& weight,
                                       const std::vector<int64_t>& mesh_shape, const Placements& p,
                                       const std::vector<int64_t>& coordinate) {
  auto chunk = local_chunk(weight, mesh_shape, p, coordinate);
  return {chunk.offset[0], chunk.shape[0]};
}

bool vocab_sharded(const Placements& p) {
  return std::any_of(p.begin(), p.end(), [](const Placement& x) { return x.is_shard(0); });
}

// The ids outside this rank's vocab rows, and the ids shifted into them (0 where outside).
std::pair<at::Tensor, at::Tensor> local_ids(const at::Tensor& ids, int64_t offset, int64_t size) {
  at::Tensor outside = (ids < offset).logical_or_(ids >= offset + size);
  return {outside, (ids - offset).masked_fill_(outside, 0)};
}

// embedding(weight [V, D], indices, padding_idx, scale_grad_by_freq, sparse) -> [*indices, D]
// A vocab-sharded weight (S(0), ids R) gives a Partial(sum) output: each rank looks up the ids in its rows
// and zeroes the others (a masked lookup).
RuleResult embedding_rule(const RuleCall& c) {
  const auto& w = c.input_shapes[0];
  const auto& ids = c.input_shapes[1];
  std::vector<AxisStrategy> s{{{Replicate(), Replicate()}, Replicate()},
                              {{Shard(0), Replicate()}, Partial()},
                              {{Shard(1), Replicate()}, Shard(static_cast<int>(ids.size()))}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) s.push_back({{Partial(op), Replicate()}, Partial(op)});
  for (size_t d = 0; d < ids.size(); ++d) {
    s.push_back({{Replicate(), Shard(static_cast<int>(d))}, Shard(static_cast<int>(d))});
  }
  RuleResult r(std::move(s));
  std::vector<int64_t> out = ids;
  out.push_back(w[1]);
  r.output_shapes = {out};
  r.run = [w](const c10::OperatorHandle& op, torch::jit::Stack& stack, const Choice& ch,
              const MeshPtr& mesh) {
    if (!vocab_sharded(ch.inputs[0])) return op.callBoxed(&stack);
    auto [offset, size] = vocab_rows(w, mesh->shape(), ch.inputs[0], mesh->coordinate());
    auto [outside, shifted] = local_ids(stack[1].toTensor(), offset, size);
    at::Tensor weight = stack[0].toTensor();
    at::Tensor y;
    if (size == 0) {  // no rows here (more ranks than vocabulary rows): every id is outside
      auto shape = shifted.sizes().vec();
      shape.push_back(weight.size(1));
      y = at::zeros(shape, weight.options());
    } else {
      y = at::embedding(weight, shifted).masked_fill_(outside.unsqueeze(-1), 0);
    }
    stack.clear();
    stack.emplace_back(y);
  };
  return r;
}

// embedding_dense_backward(grad [*indices, D], indices, num_weights, padding_idx, scale_grad_by_freq)
RuleResult embedding_backward_rule(const RuleCall& c) {
  const auto& g = c.input_shapes[0];
  const auto& ids = c.input_shapes[1];
  const auto& args = *c.args;
  std::vector<AxisStrategy> s{{{Replicate(), Replicate()}, Replicate()}};
  if (!args[4].toBool()) {
    s.push_back({{Shard(static_cast<int>(ids.size())), Replicate()}, Shard(1)});
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.push_back({{Partial(op), Replicate()}, Partial(op)});
    for (size_t d = 0; d < ids.size(); ++d) {
      s.push_back({{Shard(static_cast<int>(d)), Shard(static_cast<int>(d))}, Partial()});
    }
  }
  RuleResult r(std::move(s));
  r.output_shapes = {{args[2].toInt(), g.back()}};
  return r;
}

}  // namespace

void add_nn(RuleTable& t) {
  t["aten::native_layer_norm"] = {layer_norm_rule, true};
  t["aten::native_layer_norm_backward"] = {layer_norm_backward_rule, true};
  t["aten::embedding"] = {embedding_rule, true};
  t["aten::embedding_dense_backward"] = {embedding_backward_rule, true};
}

}  // namespace dtrain::tensor::rules
