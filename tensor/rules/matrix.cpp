// Matrix products and attention. See sharding_rules.h.
//
//   op                       per-axis options (inputs -> outputs)
//   mm(A, B)                 (R, R) -> R; (S0, R) -> S0; (R, S1) -> S1; (S1, S0) -> P(sum); (P, R), (R, P) ->
//   P bmm(A, B)                (R, R) -> R; (S0, S0) -> S0 (batch); (S1, R) -> S1; (R, S2) -> S2;
//                            (S2, S1) -> P(sum); one factor P, the other R -> P
//   addmm(C, A, B)           as mm, with C R where it broadcasts along the sharded dim, else sharded like the
//                            output; a P(sum) output needs C as P(sum)
//   flash attention (CPU)    q, k, v (and the backward's tensors) all S(0) (batch) or all S(1) (heads) ->
//     and its backward       every output alike; all R -> R. With an attention mask: R only
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include "tensor/detail/dtensor_meta.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor::rules {

namespace {

RuleResult mm_rule(const RuleCall&) {
  return std::vector<AxisStrategy>{
      {{Replicate(), Replicate()}, Replicate()}, {{Shard(0), Replicate()}, Shard(0)},
      {{Replicate(), Shard(1)}, Shard(1)},       {{Shard(1), Shard(0)}, Partial()},
      {{Partial(), Replicate()}, Partial()},     {{Replicate(), Partial()}, Partial()}};
}

// bmm(A[b, m, k], B[b, k, n]): the batch dim shards both operands alike; otherwise as mm.
RuleResult bmm_rule(const RuleCall&) {
  return std::vector<AxisStrategy>{
      {{Replicate(), Replicate()}, Replicate()}, {{Shard(0), Shard(0)}, Shard(0)},
      {{Shard(1), Replicate()}, Shard(1)},       {{Replicate(), Shard(2)}, Shard(2)},
      {{Shard(2), Shard(1)}, Partial()},         {{Partial(), Replicate()}, Partial()},
      {{Replicate(), Partial()}, Partial()}};
}

RuleResult addmm_rule(const RuleCall& c) {
  // The bias broadcasts to [m, n]: shard it along a dim only where it is not broadcast.
  const auto& bias = c.input_shapes[0];
  auto bias_for = [&](int out_dim) {
    int64_t bi = out_dim - (2 - static_cast<int64_t>(bias.size()));
    bool broadcast = bi < 0 || bias[bi] != c.out_shape()[out_dim];
    return broadcast ? Replicate() : Shard(static_cast<int>(bi));
  };
  return std::vector<AxisStrategy>{{{Replicate(), Replicate(), Replicate()}, Replicate()},
                                   {{bias_for(0), Shard(0), Replicate()}, Shard(0)},
                                   {{bias_for(1), Replicate(), Shard(1)}, Shard(1)},
                                   {{Partial(), Shard(1), Shard(0)}, Partial()},
                                   {{Partial(), Partial(), Replicate()}, Partial()},
                                   {{Partial(), Replicate(), Partial()}, Partial()}};
}

// _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask, scale)
//   -> (out [B, H, T, D], logsumexp [B, H, T])
// and its backward (grad_out, q, k, v, out, logsumexp, ...) -> (grad_q, grad_k, grad_v): every (batch, head)
// pair is independent, so B or H may stay sharded.
RuleResult attention_rule(const RuleCall& c, size_t n_tensors, size_t n_out) {
  const size_t n = c.input_shapes.size();
  std::vector<AxisStrategy> s{
      {std::vector<Placement>(n, Replicate()), std::vector<Placement>(n_out, Replicate())}};
  if (n == n_tensors) {  // no attention mask
    for (int d : {0, 1})
      s.push_back({std::vector<Placement>(n, Shard(d)), std::vector<Placement>(n_out, Shard(d))});
  }
  RuleResult r(std::move(s));
  // libtorch's CPU kernels divide by the batch size: a rank whose block is empty (more ranks than rows)
  // returns empty outputs without calling them.
  r.run = [n_out](const c10::OperatorHandle& op, torch::jit::Stack& stack, const Choice&, const MeshPtr&) {
    const at::Tensor q = stack[n_out == 2 ? 0 : 1].toTensor();
    if (q.numel() > 0) return op.callBoxed(&stack);
    if (n_out == 2) {
      const at::Tensor v = stack[2].toTensor();
      auto lse_type = at::toOpMathType(q.scalar_type());
      at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
      at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(lse_type));
      stack.clear();
      stack.emplace_back(out);
      stack.emplace_back(lse);
    } else {
      at::Tensor gq = at::zeros_like(stack[1].toTensor()), gk = at::zeros_like(stack[2].toTensor()),
                 gv = at::zeros_like(stack[3].toTensor());
      stack.clear();
      stack.emplace_back(gq);
      stack.emplace_back(gk);
      stack.emplace_back(gv);
    }
  };
  // The layouts libtorch's CPU kernels give (one process): the output in the query's dim order, the
  // logsumexp [B, H, T] stored as [B, T, H], the gradients [B, H, T, D] stored as [B, T, H, D].
  const std::vector<int64_t> heads_inside{4, 2, 3, 1};
  if (n_out == 2) {
    const auto& q = c.input_shapes[0];
    r.output_shapes = {{q[0], q[1], q[2], c.input_shapes[2][3]}, {q[0], q[1], q[2]}};
    r.output_strides = {detail::dense_strides(r.output_shapes[0], (*c.args)[0].toTensor().strides()),
                        detail::dense_strides(r.output_shapes[1], {3, 1, 2})};
  } else {
    r.output_shapes = {c.input_shapes[1], c.input_shapes[2], c.input_shapes[3]};
    for (const auto& shape : r.output_shapes)
      r.output_strides.push_back(detail::dense_strides(shape, heads_inside));
  }
  return r;
}

}  // namespace

void add_matrix(RuleTable& t) {
  t["aten::mm"] = {mm_rule};
  t["aten::bmm"] = {bmm_rule};
  t["aten::addmm"] = {addmm_rule};
  t["aten::_scaled_dot_product_flash_attention_for_cpu"] = {
      [](const RuleCall& c) { return attention_rule(c, 3, 2); }, true};
  t["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] = {
      [](const RuleCall& c) { return attention_rule(c, 6, 3); }, true};
}

}  // namespace dtrain::tensor::rules
