// Planning a call by its sharding rule; see detail/rule_plan.h.
#include "tensor/detail/rule_plan.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <optional>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dispatch_util.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor::detail {

namespace {

// A meta tensor with `t`'s global sizes, strides and storage offset.
at::Tensor meta_like(const at::Tensor& t) {
  const int64_t extent = storage_extent(t.sizes().vec(), t.strides().vec(), t.storage_offset());
  return at::empty({extent}, t.options().device(at::kMeta))
      .as_strided(t.sizes(), t.strides(), t.storage_offset());
}

bool is_out_argument(const c10::Argument& a) {
  return a.kwarg_only() && a.alias_info() != nullptr && a.alias_info()->isWrite();
}

// The functional form of an out= op: the overload of the same name whose arguments are the out= op's less
// its written keyword arguments (sum.IntList_out -> sum.dim_IntList, mean.out -> mean.dim). Matched on the
// schema, not on the overload's name, so that no out= op is mistaken for another overload.
std::optional<c10::OperatorHandle> functional_form(const c10::OperatorHandle& op) {
  static const auto overloads = [] {  // op name -> its overload names
    std::unordered_map<std::string, std::vector<std::string>> m;
    for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) m[n.name].push_back(n.overload_name);
    return m;
  }();
  const auto& schema = op.schema();
  std::vector<const c10::Argument*> want;
  for (const auto& a : schema.arguments()) {
    if (!is_out_argument(a)) want.push_back(&a);
  }
  if (want.size() == schema.arguments().size()) return std::nullopt;
  auto it = overloads.find(schema.name());
  if (it == overloads.end()) return std::nullopt;
  for (const std::string& overload : it->second) {
    auto h = c10::Dispatcher::singleton().findOp({schema.name(), overload});
    if (!h || h->schema().overload_name() == schema.overload_name()) continue;
    const auto& args = h->schema().arguments();
    if (args.size() != want.size()) continue;
    bool same = true;
    for (size_t i = 0; i < args.size() && same; ++i) {
      same = args[i].name() == want[i]->name() && *args[i].type() == *want[i]->type() &&
             args[i].alias_info() == nullptr;
    }
    if (same) return h;
  }
  return std::nullopt;
}

}  // namespace

void for_each_choice(const c10::OperatorHandle& op, const RuleResult& res, size_t n_inputs,
                     const std::vector<std::vector<int64_t>>& shapes, const std::vector<size_t>& first_of,
                     int axes, const Placements* in_place, const std::function<void(const Choice&)>& f) {
  const size_t n_out = res.options.empty() ? 0 : res.options[0].outputs.size();
  std::vector<size_t> pick(axes, 0);
  for (;;) {
    Choice ch{std::vector<Placements>(n_inputs, Placements(axes)),
              std::vector<Placements>(n_out, Placements(axes))};
    for (int a = 0; a < axes; ++a) {
      const AxisStrategy& o = res.options[pick[a]];
      DTRAIN_ASSERT(o.inputs.size() == n_inputs, op_name(op), ": the rule gives ", o.inputs.size(),
                    " input placements for ", n_inputs, " DTensor arguments");
      for (size_t k = 0; k < n_inputs; ++k) ch.inputs[k][a] = o.inputs[k];
      for (size_t r = 0; r < n_out; ++r) ch.outputs[r][a] = o.outputs[r];
    }
    bool ok = true;
    try {
      for (size_t r = 0; r < n_out; ++r) {
        if (first_of[r] < first_of[r + 1]) {
          check_placements("rule", ch.outputs[r], static_cast<int64_t>(shapes[first_of[r]].size()), axes);
        }
      }
      if (in_place && (ch.outputs[0] != *in_place || ch.inputs[0] != ch.outputs[0])) ok = false;
      if (ok && res.valid && !res.valid(ch)) ok = false;  // not computable on blocks
    } catch (const Error&) {
      ok = false;  // an invalid combination (mixed Partial kinds, a sharded dim the output lacks, ...)
    }
    if (ok) f(ch);
    int a = axes - 1;
    while (a >= 0 && ++pick[a] == res.options.size()) pick[a--] = 0;
    if (a < 0) break;
  }
}

namespace {

// Prices every combination of per-axis options by the redistribution its inputs need and keeps the cheapest
// valid one; nullopt when none applies (or the output shapes are unknown).
// `in_place`: the op writes its first argument (a DTensor, dts[0]), which keeps its placements; only options
// whose output and first input equal them qualify. `base`: the stack index of args[0] (dts hold stack
// indices).
std::optional<RulePlan> plan_rule(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                  const RuleSpec& spec, const std::vector<std::pair<size_t, at::Tensor>>& dts,
                                  const MeshPtr& mesh, bool in_place, size_t base) {
  const auto& schema = op.schema();
  const size_t n_ret = schema.returns().size();
  RuleCall call;
  call.mesh_shape = mesh->shape();
  for (auto& [i, t] : dts) call.input_shapes.push_back(t.sizes().vec());
  call.args = &args;
  // Each argument's index among the DTensors: a rule that treats arguments differently (div's numerator,
  // sub's first operand) must know where each DTensor sits, as a 0-d plain tensor (a scalar) is not one.
  {
    call.dtensor_index.assign(args.size(), -1);
    for (size_t k = 0; k < dts.size(); ++k) {
      const size_t i = dts[k].first - base;
      if (i < args.size() && call.dtensor_index[i] < 0) call.dtensor_index[i] = static_cast<int>(k);
    }
  }
  Outputs inferred;
  if (!spec.gives_shapes) {
    inferred = infer_outputs(op, args, dts);
    if (inferred.shapes.empty()) return std::nullopt;
    call.output_shapes = inferred.shapes;
  }
  auto rule = [&] {
    try {
      return spec.rule(call);
    } catch (const ValueError& e) {  // bad arguments, found before libtorch's kernel would
      throw ValueError(str_cat(rank_prefix(), " DTensor: ", op_name(op), ": ", e.what()));
    }
  };
  RulePlan plan{rule(), {}, {}, {}, {0}, {}, {}};
  const RuleResult& res = plan.res;
  plan.shapes = spec.gives_shapes ? res.output_shapes : call.output_shapes;
  // Ops whose shapes the rule gives (no meta kernel) return fresh tensors, contiguous unless the rule says.
  plan.strides = spec.gives_shapes ? res.output_strides : inferred.strides;
  plan.strides.resize(plan.shapes.size());
  plan.offsets = spec.gives_shapes ? std::vector<int64_t>() : inferred.offsets;
  plan.offsets.resize(plan.shapes.size(), 0);
  const auto& shapes = plan.shapes;
  if (res.options.empty()) return std::nullopt;
  const size_t n_out = res.options[0].outputs.size();
  auto& first_of = plan.first_of;
  for (size_t r = 0; r < n_ret; ++r) {
    size_t count = 1;
    if (schema.returns()[r].type()->kind() == c10::TypeKind::ListType) count = shapes.size() - (n_ret - 1);
    first_of.push_back(first_of.back() + count);
  }
  DTRAIN_ASSERT(n_out == n_ret && first_of.back() == shapes.size(), op_name(op), ": the rule gives ", n_out,
                " output placements and ", shapes.size(), " shapes for ", n_ret, " returns");

  // Every valid combination of one option per axis; keep the cheapest.
  double best_cost = 0;
  std::optional<Choice> best;
  const Placements* kept = in_place ? &placements_of(dts[0].second) : nullptr;
  for_each_choice(op, res, dts.size(), shapes, first_of, mesh->ndim(), kept, [&](const Choice& ch) {
    double cost = 0;
    try {
      for (size_t k = 0; k < dts.size(); ++k) cost += redistribute_plan(dts[k].second, ch.inputs[k])->cost;
    } catch (const Error&) {
      return;  // no way to reach these inputs: skip the combination
    }
    plan.choices.push_back(ch);
    if (!best || cost < best_cost) {
      best_cost = cost;
      best = ch;
    }
  });
  if (!best) return std::nullopt;
  plan.best = std::move(*best);
  return plan;
}

// The strategy cache's key for a call: the op, the mesh (shape and ranks), and every argument that a rule may
// read (DTensors by dtype, shape and placements; plain scalars by dtype; ints, floats, bools, strings and
// lists by value). Empty when an argument cannot be keyed (the call is then planned afresh).
std::string strategy_key(const c10::OperatorHandle& op, const torch::jit::Stack& args, const MeshPtr& mesh,
                         bool in_place, int out_index) {
  std::string k;
  k.reserve(128);
  auto raw = [&k](const auto& x) { k.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  raw(&op.schema());
  for (int64_t d : mesh->shape()) raw(d);
  k += '|';
  for (int r : mesh->global_ranks()) raw(r);  // the mesh's identity: its ranks, not only its shape
  k += in_place ? 'I' : 'F';
  raw(out_index);
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) {
      k += 'U';
      return;
    }
    k += is_dtensor(t) ? 'D' : 'T';
    raw(static_cast<int8_t>(t.scalar_type()));
    raw(static_cast<int8_t>(t.dim()));
    if (!is_dtensor(t)) return;
    for (int64_t d : t.sizes()) raw(d);
    for (int64_t d : t.strides()) raw(d);  // global strides: the meta kernel's output layout reads them
    raw(t.storage_offset());               // and a view's offset
    for (const Placement& p : meta_of(t).placements) {
      raw(static_cast<int8_t>(p.kind));
      raw(static_cast<int8_t>(p.dim));
      raw(static_cast<int8_t>(p.op));
    }
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isInt()) {
      k += 'i';
      raw(v.toInt());
    } else if (v.isDouble()) {
      k += 'd';
      raw(v.toDouble());
    } else if (v.isBool()) {
      k += v.toBool() ? 'y' : 'n';
    } else if (v.isNone()) {
      k += '0';
    } else if (v.isIntList()) {
      k += 'l';
      for (int64_t x : v.toIntList()) raw(x);
      k += ';';
    } else if (v.isTensorList()) {
      k += 'L';
      for (const at::Tensor& t : v.toTensorList()) tensor(t);
      k += ';';
    } else if (v.isOptionalTensorList()) {
      k += 'O';
      for (std::optional<at::Tensor> t : v.toOptionalTensorList()) tensor(t ? *t : at::Tensor());
      k += ';';
    } else if (v.isString()) {
      k += 's';
      k += v.toStringRef();
      k += '\0';
    } else if (v.isGenerator() || v.isDevice()) {
      k += 'g';  // not read by any rule
    } else {
      return {};
    }
  }
  return k;
}

}  // namespace

Outputs infer_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                      const std::vector<std::pair<size_t, at::Tensor>>& dts) {
  torch::jit::Stack meta(args);
  for (auto& iv : meta) {  // lists are shared between IValue copies: give the meta call its own
    if (iv.isTensorList()) iv = c10::List<at::Tensor>(iv.toTensorVector());
    if (iv.isOptionalTensorList()) iv = c10::List<std::optional<at::Tensor>>(iv.toOptionalTensorList().vec());
  }
  for_each_tensor(meta, meta.size(),
                  [&](const at::Tensor& t, size_t) { return is_dtensor(t) ? meta_like(t) : at::Tensor(); });
  Outputs out;
  try {
    op.callBoxed(&meta);
    for (const at::Tensor& t : returned_tensors(meta, meta.size())) {
      out.shapes.push_back(t.sizes().vec());
      out.strides.push_back(t.strides().vec());
      out.offsets.push_back(t.storage_offset());
    }
    return out;
  } catch (const c10::NotImplementedError&) {
    // no meta kernel in C++
  }
  if (op.hasTag(at::Tag::pointwise) && op.schema().returns().size() == 1) {
    std::vector<int64_t> shape;
    for (auto& [i, t] : dts) shape = at::infer_size(shape, t.sizes());
    const at::Tensor& first = dts[0].second;
    out.strides.push_back(detail::dense_strides(
        shape, first.dim() == static_cast<int64_t>(shape.size()) ? first.strides() : c10::IntArrayRef{}));
    out.shapes.push_back(std::move(shape));
    out.offsets.push_back(0);
  }
  return out;
}

// The op's rule (or nullptr), looked up once per op; an out= op takes its functional form's rule.
const RuleSpec* rule_of(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const void*, const RuleSpec*> rules;
  auto it = rules.find(&op.schema());
  if (it != rules.end()) return it->second;
  const RuleSpec* rule = nullptr;
  if (auto f = functional_form(op)) {
    rule = find_rule(op_name(*f), f->hasTag(at::Tag::pointwise));
  } else {
    rule = find_rule(op_name(op), op.hasTag(at::Tag::pointwise));
  }
  return rules[&op.schema()] = rule;
}

// Plans per (op, arguments' specs) once: later calls with the same key reuse the decision (nullptr: the rule
// does not apply). Per thread (the backward pass may run on autograd's threads); bounded. Shared pointers, so
// a plan in use survives the cache being cleared by a nested call.
std::shared_ptr<const RulePlan> cached_plan(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                            const RuleSpec& spec,
                                            const std::vector<std::pair<size_t, at::Tensor>>& dts,
                                            const MeshPtr& mesh, bool in_place, int out_index, size_t base) {
  thread_local std::unordered_map<std::string, std::shared_ptr<const RulePlan>> cache;
  auto plan = [&]() -> std::shared_ptr<const RulePlan> {
    std::optional<RulePlan> p = plan_rule(op, args, spec, dts, mesh, in_place, base);
    return p ? std::make_shared<const RulePlan>(std::move(*p)) : nullptr;
  };
  std::string key = strategy_key(op, args, mesh, in_place, out_index);
  if (key.empty()) return plan();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto made = plan();
  if (cache.size() >= 4096) cache.clear();
  cache.emplace(std::move(key), made);
  return made;
}

}  // namespace dtrain::tensor::detail
