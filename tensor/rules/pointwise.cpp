// Pointwise ops (with broadcasting), ops that keep every layout (detach, clone, casts), *_like factories and
// random fills (dropout). See sharding_rules.h.
//
//   op                         per-axis options (inputs -> outputs)
//   pointwise (tagged), n-ary  all R -> R; for each output dim d: each input S(its aligned dim), or R where
//   it
//                              broadcasts along d -> S(d)
//     linear ones (add, sub,   also all P -> P (same reduce op; no plain tensor argument)
//     neg, mul/div by Scalar)
//     add, sub                 also P(max|min) as argument 0, the others R -> the same P (a shift of every
//                              part; not as the subtrahend: a - max is a min)
//     mul, div (Tensor)        also one P(sum/avg) factor, the others R -> P; for div only the numerator
//                              (argument 0; a 0-d plain tensor there is a scalar, and the divisor is reduced)
//   detach, clone, alias,      every placement to itself
//     lift_fresh
//   _to_copy                   every placement to itself, but a Partial only where the cast commutes with
//                              its reduction (sum/avg: floating to floating; max/min: not to bool)
//   *_like factories           R -> R, S(d) -> S(d), P -> R (only the shape is read)
//   new_empty_strided, new_*   R -> R, P -> R; S(d) -> S(d) where the result has self's shape
//   copy_, copy                aligned shards (src broadcast); P -> P of any kind where the cast keeps it
//   zero_, zero                every placement to itself (every part 0)
//   fill_, fill (Scalar)       R, S(d), P(avg|max|min) to themselves; P(sum) -> R (in place: back to P(sum))
//   bernoulli_, uniform_,      S(d) and R: this rank's block of one global draw from DTensor's own Philox
//     normal_, rand_like,      stream (tensor/dtensor_random.h), the same on every rank whatever its own seed; a
//     randn_like               sharded tensor draws only its block
//   native_dropout             as the fills: the global mask's block; R, S(d)
#include <ATen/ATen.h>

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/dtensor_random.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor::rules {

namespace {

bool only_dtensor_tensors(const RuleCall& c) {
  size_t tensors = 0;
  for (const auto& a : *c.args) {
    if (a.isTensor() && a.toTensor().defined()) ++tensors;
  }
  return tensors == c.input_shapes.size();
}

std::vector<AxisStrategy> broadcast_options(const RuleCall& c) {
  const size_t n = c.input_shapes.size();
  const auto& out_shape = c.out_shape();
  const int64_t out_ndim = static_cast<int64_t>(out_shape.size());
  std::vector<AxisStrategy> s;
  s.push_back({std::vector<Placement>(n, Replicate()), Replicate()});
  for (int64_t d = 0; d < out_ndim; ++d) {
    AxisStrategy option{{}, Shard(static_cast<int>(d))};
    for (const auto& shape : c.input_shapes) {
      int64_t di = d - (out_ndim - static_cast<int64_t>(shape.size()));
      bool broadcast = di < 0 || shape[di] != out_shape[d];
      option.inputs.push_back(broadcast ? Replicate() : Shard(static_cast<int>(di)));
    }
    s.push_back(option);
  }
  return s;
}

RuleResult pointwise_rule(const RuleCall& c) { return broadcast_options(c); }

// Ops linear in every tensor argument: Partial inputs (all with one reduce op) give a Partial output.
RuleResult linear_rule(const RuleCall& c) {
  auto s = broadcast_options(c);
  if (only_dtensor_tensors(c)) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.push_back({std::vector<Placement>(c.input_shapes.size(), Partial(op)), Partial(op)});
  }
  return s;
}

// add/sub (and in place): linear, and also a Partial(max) or Partial(min) first argument plus Replicate
// others stays that Partial: max_i(p_i + a y) = max_i(p_i) + a y for any alpha, since every part shifts
// alike. Only the first argument: a - max_i(p_i) is min_i(a - p_i), not a max.
RuleResult additive_rule(const RuleCall& c) {
  RuleResult r = linear_rule(c);
  const size_t n = c.input_shapes.size();
  const int first = c.dtensor_at(0);
  if (first >= 0 && c.input_shapes[first] == c.out_shape()) {  // the Partial operand must not broadcast
    for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
      std::vector<Placement> in(n, Replicate());
      in[first] = Partial(op);
      r.options.push_back({in, Partial(op)});
    }
  }
  return r;
}

// mul/div: linear in one factor at a time, the others Replicate (both Partial on one axis would give the
// product of sums, not the sum of products). div is linear in its numerator (argument 0) only: a / sum_i x_i
// is not sum_i a / x_i, so a Partial divisor is reduced first.
RuleResult product_rule(const RuleCall& c, bool numerator_only) {
  auto s = broadcast_options(c);
  const size_t n = c.input_shapes.size();
  for (size_t k = 0; k < n; ++k) {
    if (numerator_only && static_cast<int>(k) != c.dtensor_at(0)) continue;
    if (n == 1 || c.input_shapes[k] == c.out_shape()) {  // the Partial factor must not broadcast
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        std::vector<Placement> in(n, Replicate());
        in[k] = Partial(op);
        s.push_back({in, Partial(op)});
      }
    }
  }
  return s;
}

// Casting a part keeps a Partial's meaning: sum and avg between floating types, max and min through any
// order-preserving cast.
bool cast_keeps(ReduceOp op, at::ScalarType from, at::ScalarType to) {
  auto floating = [](at::ScalarType t) { return at::isFloatingType(t) || at::isComplexType(t); };
  if (op == ReduceOp::kSum || op == ReduceOp::kAvg) return floating(from) && floating(to);
  return to != at::kBool && !at::isComplexType(from) && !at::isComplexType(to);
}

RuleResult identity_rule(const RuleCall& c) { return identity_options(c.input_shapes[0].size()); }

// _to_copy(x, dtype, ...): a cast keeps a Partial only where it commutes with the reduction: sum and avg
// between floating types (casting 0.6 + 0.6 to an integer part by part gives 0, not 1), max and min through
// any order-preserving cast (not to bool, whose x != 0 is not monotone).
RuleResult to_copy_rule(const RuleCall& c) {
  const auto& args = *c.args;
  const at::ScalarType from = args[0].toTensor().scalar_type();
  const at::ScalarType to = args.size() > 1 && args[1].isInt() ? args[1].toScalarType() : from;
  std::vector<AxisStrategy> s;
  for (AxisStrategy& o : identity_options(c.input_shapes[0].size())) {
    const Placement& p = o.inputs[0];
    if (p.is_partial() && !cast_keeps(p.op, from, to)) continue;
    s.push_back(std::move(o));
  }
  return s;
}

// R -> R and S(d) -> S(d) for one input, every output alike; no Partial.
std::vector<AxisStrategy> unpartial_options(size_t ndim, size_t n_out) {
  std::vector<AxisStrategy> s{{{Replicate()}, std::vector<Placement>(n_out, Replicate())}};
  for (size_t d = 0; d < ndim; ++d) {
    s.push_back({{Shard(static_cast<int>(d))}, std::vector<Placement>(n_out, Shard(static_cast<int>(d)))});
  }
  return s;
}

// *_like factories read only the input's shape: a Partial input gives a Replicate output without any
// communication.
RuleResult like_rule(const RuleCall& c) {
  auto s = unpartial_options(c.input_shapes[0].size(), 1);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
    s.push_back({{Partial(op)}, Replicate()});
  return s;
}

// copy_(self, src) and copy(self, src): the result is src (cast to self's dtype, broadcast to self's shape),
// laid out as self may be: aligned shards, or src's parts as self's parts (a Partial of either kind, where
// the cast keeps it). A 0-d plain src is a scalar: every part holds it, right for avg, max and min.
RuleResult copy_rule(const RuleCall& c) {
  auto s = broadcast_options(c);
  const at::ScalarType to = (*c.args)[0].toTensor().scalar_type();
  const bool tensor_src = c.input_shapes.size() == 2;
  const at::ScalarType from = tensor_src ? (*c.args)[1].toTensor().scalar_type() : to;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    if (tensor_src && c.input_shapes[1] == c.input_shapes[0] && cast_keeps(op, from, to)) {
      s.push_back({{Partial(op), Partial(op)}, Partial(op)});
    } else if (!tensor_src && op != ReduceOp::kSum) {
      s.push_back({{Partial(op)}, Partial(op)});
    }
  }
  return s;
}

// fill_(self, value) and fill(self, value): every placement but Partial(sum) holds the value in every part;
// the functional form turns a Partial(sum) into Replicate (in place, the handler redistributes that back).
RuleResult fill_rule(const RuleCall& c) {
  auto s = unpartial_options(c.input_shapes[0].size(), 1);
  for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
    s.push_back({{Partial(op)}, Partial(op)});
  s.push_back({{Partial(ReduceOp::kSum)}, Replicate()});
  return s;
}

// new_empty_strided, new_empty, new_zeros, new_ones, new_full: read only self's dtype and device. The result
// keeps self's shards where it has self's shape; otherwise it is Replicate.
RuleResult new_rule(const RuleCall& c) {
  const size_t ndim = c.input_shapes[0].size();
  const bool same_shape = c.out_shape() == c.input_shapes[0];
  auto s = unpartial_options(same_shape ? ndim : 0, 1);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
    s.push_back({{Partial(op)}, Replicate()});
  return s;
}

void refuse_generator(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  for (const c10::IValue& v : stack) {
    if (v.isGenerator()) {
      throw NotSupportedError(str_cat(
          rank_prefix(), " DTensor: ", op.schema().name(),
          " was given an explicit generator; random ops on DTensors draw from DTensor's own stream, the same "
          "on every rank (dtrain::tensor::manual_seed). Leave the generator out."));
    }
  }
}

// Random ops: this rank's block of the values one process would draw for the global tensor, from DTensor's
// stream (tensor/dtensor_random.h). In place (bernoulli_, uniform_, normal_) the block is overwritten; out of place
// (rand_like, randn_like) a block of the asked dtype is filled (the op itself would draw from, and advance,
// the process's default generator for nothing).
RuleResult random_rule(const RuleCall& c) {
  RuleResult r = unpartial_options(c.input_shapes[0].size(), 1);
  std::vector<int64_t> shape = c.input_shapes[0];
  r.run = [shape](const c10::OperatorHandle& op, torch::jit::Stack& stack, const Choice& choice,
                  const MeshPtr& mesh) {
    refuse_generator(op, stack);
    const std::string& name = op.schema().name();
    detail::RandomKind kind = detail::RandomKind::kUniform;
    double a = 0, b = 1;
    if (name == "aten::bernoulli_") {
      kind = detail::RandomKind::kBernoulli;
      a = stack[1].toDouble();
    } else if (name == "aten::uniform_" || name == "aten::normal_") {
      kind = name == "aten::normal_" ? detail::RandomKind::kNormal : detail::RandomKind::kUniform;
      a = stack[1].toDouble();
      b = stack[2].toDouble();
    } else if (name == "aten::randn_like") {
      kind = detail::RandomKind::kNormal;
    }
    const auto* alias = op.schema().arguments()[0].alias_info();
    at::Tensor out = stack[0].toTensor();
    if (alias == nullptr || !alias->isWrite()) {  // rand_like(self, dtype?, ...): a block of that dtype
      const at::ScalarType dtype =
          stack.size() > 1 && stack[1].isInt() ? stack[1].toScalarType() : out.scalar_type();
      out = at::empty_like(out, out.options().dtype(dtype));
    }
    auto chunk = local_chunk(shape, mesh->shape(), choice.outputs[0], mesh->coordinate());
    detail::random_fill(out, shape, chunk.offset, mesh, kind, a, b);
    stack.clear();
    stack.emplace_back(out);
  };
  return r;
}

// native_dropout(input, p, train) -> (output, mask): the mask is this rank's block of the one mask drawn for
// the global tensor (kept with probability 1 - p); output = input * mask / (1 - p), as libtorch computes it.
RuleResult dropout_rule(const RuleCall& c) {
  RuleResult r = unpartial_options(c.input_shapes[0].size(), 2);
  std::vector<int64_t> shape = c.input_shapes[0];
  r.output_shapes = {shape, shape};
  r.run = [shape](const c10::OperatorHandle&, torch::jit::Stack& stack, const Choice& choice,
                  const MeshPtr& mesh) {
    at::Tensor local = stack[0].toTensor();
    double p = stack[1].toDouble();
    bool train = stack.size() < 3 || stack[2].isNone() || stack[2].toBool();
    at::Tensor keep = at::ones(local.sizes(), local.options().dtype(at::kFloat));
    if (train) {
      auto chunk = local_chunk(shape, mesh->shape(), choice.outputs[1], mesh->coordinate());
      detail::random_fill(keep, shape, chunk.offset, mesh, detail::RandomKind::kBernoulli, 1.0 - p, 0);
    }
    at::Tensor mask = keep.to(at::kBool);
    double scale = !train ? 1.0 : p >= 1 ? 0.0 : 1.0 / (1.0 - p);
    stack.clear();
    stack.emplace_back(local.mul(mask).mul_(scale));
    stack.emplace_back(mask);
  };
  return r;
}

}  // namespace

const RuleSpec& pointwise_spec() {
  static const RuleSpec spec{pointwise_rule};
  return spec;
}

void add_pointwise(RuleTable& t) {
  for (const char* op : {"aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::sub_.Tensor"}) {
    t[op] = {additive_rule};
  }
  for (const char* op :
       {"aten::neg", "aten::mul.Scalar", "aten::mul_.Scalar", "aten::div.Scalar", "aten::div_.Scalar"}) {
    t[op] = {linear_rule};
  }
  for (const char* op : {"aten::mul.Tensor", "aten::mul_.Tensor"}) {
    t[op] = {[](const RuleCall& c) { return product_rule(c, false); }};
  }
  for (const char* op : {"aten::div.Tensor", "aten::div_.Tensor"}) {
    t[op] = {[](const RuleCall& c) { return product_rule(c, true); }};
  }
  for (const char* op : {"aten::detach", "aten::clone", "aten::alias", "aten::lift_fresh"}) {
    t[op] = {identity_rule};
  }
  t["aten::_to_copy"] = {to_copy_rule};
  for (const char* op : {"aten::copy_", "aten::copy"}) t[op] = {copy_rule};
  for (const char* op : {"aten::zero_", "aten::zero"}) t[op] = {identity_rule};  // zero parts: 0 for every op
  for (const char* op : {"aten::fill_.Scalar", "aten::fill.Scalar"}) t[op] = {fill_rule};
  for (const char* op : {"aten::new_empty_strided", "aten::new_empty", "aten::new_zeros", "aten::new_ones",
                         "aten::new_full"}) {
    t[op] = {new_rule};
  }
  for (const char* op : {"aten::ones_like", "aten::zeros_like", "aten::empty_like", "aten::full_like"}) {
    t[op] = {like_rule};
  }
  for (const char* op :
       {"aten::bernoulli_.float", "aten::uniform_", "aten::normal_", "aten::rand_like", "aten::randn_like"}) {
    t[op] = {random_rule, false, true};
  }
  t["aten::native_dropout"] = {dropout_rule, true, true};
}

}  // namespace dtrain::tensor::rules
