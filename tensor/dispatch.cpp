// The DTensor dispatcher handler (DESIGN §4, "Transparent execution"): every aten op on a DTensor reaches
// handle() through the fallback of DTensor's dispatch key (kDTensorKey, PrivateUse1 unless the build says
// otherwise), and through per-op kernels on the ops whose
// CompositeExplicitAutograd kernels would otherwise run first and allocate global-size plain tensors.
//
//   inputs                                             what runs                       outputs
//   all DTensors Replicate                             the op on the local blocks      Replicate
//   an op with a sharding rule (sharding_rules.h);     the cheapest rule option after  the option's
//     in place: ops writing their first argument;      redistributing the inputs       placements (in place:
//     out=: the functional form's rule                                                 the argument's own)
//   anything else (no sharding rule yet)               gather to Replicate, run, warn  Replicate
//                                                      once per op (strict: error)
// In-place and out= arguments get their original DTensor back; when the op ran on a gathered copy, the result
// is written back into the argument's own block under its own placements.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "tensor/comm_log.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/on_demand.h"
#include "tensor/redistribute.h"
#include "tensor/settings.h"
#include "tensor/shard_math.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor {

namespace {

std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.schema().operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

void warn_once(const std::string& op, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(op).second) {
    log_warn("DTensor: ", op, " has no sharding rule for ", why,
             "; gathering its inputs to Replicate (correct, but moves the whole tensor). Set "
             "DTRAIN_DTENSOR_STRICT=1 to make this an error.");
  }
}

const detail::DTensorMeta& meta_of(const at::Tensor& t) {
  return *static_cast<const detail::DTensorMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

bool all_replicate(const Placements& p) {
  return std::all_of(p.begin(), p.end(), [](const Placement& x) { return x.is_replicate(); });
}

// Visits every tensor in the top `n` stack entries (tensors and tensor lists).
template <typename F>
void for_each_tensor(torch::jit::Stack& stack, size_t n, F&& f) {
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    c10::IValue& iv = stack[i];
    if (iv.isTensor()) {
      at::Tensor t = iv.toTensor();
      if (auto r = f(t, i); r.defined()) iv = r;
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        if (auto r = f(list.get(j), i); r.defined()) list.set(j, r);
      }
    } else if (iv.isOptionalTensorList()) {
      auto list = iv.toOptionalTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        std::optional<at::Tensor> t = list.get(j);
        if (!t) continue;
        if (auto r = f(*t, i); r.defined()) list.set(j, r);
      }
    }
  }
}

std::atomic<int64_t> g_gathers{0};

// The tensors of the returned values on top of `stack` (`n_ret` of them), lists flattened.
std::vector<at::Tensor> returned_tensors(const torch::jit::Stack& stack, size_t n_ret) {
  std::vector<at::Tensor> out;
  for (size_t i = stack.size() - n_ret; i < stack.size(); ++i) {
    if (stack[i].isTensor()) out.push_back(stack[i].toTensor());
    if (stack[i].isTensorList()) {
      for (const at::Tensor& t : stack[i].toTensorList()) out.push_back(t);
    }
  }
  return out;
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// "[7, 5] strides [5, 1] Float (S(0), R)": what an op's decision depends on for one DTensor argument.
std::string describe_arg(const at::Tensor& t) {
  return str_cat(t.sizes(), " strides ", t.strides(), " ", t.scalar_type(), " ",
                 to_string(meta_of(t).placements));
}

// DTRAIN_DTENSOR_CHECK (check mode) and plain tensors in strict mode: every rank must take the same decision
// for an op, and a plain tensor taken as Replicate must be the same on every rank. verify() exchanges a hash
// of this rank's decision and a fingerprint of its plain tensors over the mesh (one small all_gather) and
// raises the same ValueError on every rank when they differ, naming the op and the ranks on each side.
struct DecisionCheck {
  bool decisions = false;  // check mode
  bool plains = false;     // check or strict mode: fingerprint plain tensors
  uint64_t plain = 0;      // fingerprint of the plain tensors seen (0: none)
  std::string plain_what;  // which they are

  void add_plain(const at::Tensor& t, size_t arg) {
    at::Tensor c = t.contiguous();
    uint64_t h = fnv1a(c.sizes().data(), c.sizes().size() * sizeof(int64_t), plain ? plain : 7);
    h = fnv1a(c.const_data_ptr(), static_cast<size_t>(c.numel()) * c.element_size(), h);
    plain = h | 1;  // never 0
    plain_what += str_cat(plain_what.empty() ? "" : ", ", "argument ", arg, " ", t.sizes());
  }

  void verify(const c10::OperatorHandle& op, const MeshPtr& mesh,
              const std::vector<std::pair<size_t, at::Tensor>>& dts, const std::string& decision) const {
    if (!decisions && plain == 0) return;
    std::string what;
    if (decisions) {
      what = op_name(op) + ": " + decision;
      for (const auto& [i, t] : dts) what += " | " + describe_arg(t);
    }
    const auto& group = mesh->group();
    const int n = group->group_size();
    at::Tensor mine = at::tensor(
        {static_cast<int64_t>(decisions ? fnv1a(what.data(), what.size()) : 0), static_cast<int64_t>(plain)},
        at::kLong);
    at::Tensor all = at::empty({n, 2}, at::kLong);
    group->all_gather(all, mine)->wait();
    auto differ = [&](int col) {
      std::map<int64_t, std::vector<int>> sides;
      for (int g = 0; g < n; ++g) sides[all[g][col].item<int64_t>()].push_back(group->global_ranks()[g]);
      if (sides.size() <= 1) return std::string();
      std::string out;
      for (const auto& [h, ranks] : sides) {
        std::string list;
        for (int r : ranks) list += str_cat(list.empty() ? "" : ", ", r);
        const bool mine_side = h == mine[col].item<int64_t>();
        out += str_cat(out.empty() ? "" : " vs ", "ranks {", list, "}", mine_side ? " (this rank)" : "");
      }
      return out;
    };
    if (std::string d = differ(0); !d.empty()) {
      throw ValueError(
          str_cat(rank_prefix(), " DTRAIN_DTENSOR_CHECK: the ranks decided differently for ", op_name(op),
                  ": ", d, ". This rank decided: ", what,
                  ". Every decision must depend on global shapes, strides, placements and dtypes "
                  "only; report this with the op and placements."));
    }
    if (std::string d = differ(1); !d.empty()) {
      throw ValueError(str_cat(
          rank_prefix(), " DTensor: ", op_name(op), " got a plain tensor (", plain_what,
          ") that differs across ranks: ", d,
          ". A plain tensor meeting a DTensor is taken as Replicate, the same on every rank. Make "
          "rank-specific "
          "values a DTensor with from_local() (Shard or Partial), or compute them alike on every rank."));
    }
  }
};

// The outputs' global shapes and strides, as libtorch lays them out on one process: from the op's meta
// kernel on meta tensors of the inputs' global shapes and strides. Empty when the op has no meta kernel in
// C++; then a pointwise op's shape is its inputs' broadcast, dense in its first input's dim order. A meta
// kernel's own error (a view of a tensor whose strides do not allow it, a bad dim) is libtorch's answer for
// the global tensor and is raised on every rank alike.
struct Outputs {
  std::vector<std::vector<int64_t>> shapes, strides;
};

Outputs infer_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                      const std::vector<std::pair<size_t, at::Tensor>>& dts) {
  torch::jit::Stack meta(args);
  for (auto& iv : meta) {  // lists are shared between IValue copies: give the meta call its own
    if (iv.isTensorList()) iv = c10::List<at::Tensor>(iv.toTensorVector());
    if (iv.isOptionalTensorList()) iv = c10::List<std::optional<at::Tensor>>(iv.toOptionalTensorList().vec());
  }
  for_each_tensor(meta, meta.size(), [&](const at::Tensor& t, size_t) {
    return is_dtensor(t) ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                         : at::Tensor();
  });
  Outputs out;
  try {
    op.callBoxed(&meta);
    for (const at::Tensor& t : returned_tensors(meta, meta.size())) {
      out.shapes.push_back(t.sizes().vec());
      out.strides.push_back(t.strides().vec());
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
  }
  return out;
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

// A rule's decision for one call: the hooks, the outputs' global shapes, which returned tensors each output
// placement covers (a Tensor[] return has many: [first_of[r], first_of[r + 1])), and the chosen placements.
struct RulePlan {
  RuleResult res;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<int64_t>> strides;  // empty for an output: contiguous
  std::vector<size_t> first_of;
  Choice best;
};

// Prices every combination of per-axis options by the redistribution its inputs need and keeps the cheapest
// valid one; nullopt when none applies (or the output shapes are unknown).
// `in_place`: the op writes its first argument (a DTensor, dts[0]), which keeps its placements; only options
// whose output and first input equal them qualify.
std::optional<RulePlan> plan_rule(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                  const RuleSpec& spec, const std::vector<std::pair<size_t, at::Tensor>>& dts,
                                  const MeshPtr& mesh, bool in_place) {
  const auto& schema = op.schema();
  const size_t n_ret = schema.returns().size();
  RuleCall call;
  call.mesh_shape = mesh->shape();
  for (auto& [i, t] : dts) call.input_shapes.push_back(t.sizes().vec());
  call.args = &args;
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
  RulePlan plan{rule(), {}, {}, {0}, {}};
  const RuleResult& res = plan.res;
  plan.shapes = spec.gives_shapes ? res.output_shapes : call.output_shapes;
  // Ops whose shapes the rule gives (no meta kernel) return fresh contiguous tensors.
  plan.strides = spec.gives_shapes ? std::vector<std::vector<int64_t>>() : inferred.strides;
  plan.strides.resize(plan.shapes.size());
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

  // Every combination of one option per axis; keep the cheapest valid one.
  const int axes = mesh->ndim();
  std::vector<size_t> pick(axes, 0);
  double best_cost = 0;
  std::optional<Choice> best;
  for (;;) {
    Choice ch{std::vector<Placements>(dts.size(), Placements(axes)),
              std::vector<Placements>(n_out, Placements(axes))};
    for (int a = 0; a < axes; ++a) {
      const AxisStrategy& o = res.options[pick[a]];
      DTRAIN_ASSERT(o.inputs.size() == dts.size(), op_name(op), ": the rule gives ", o.inputs.size(),
                    " input placements for ", dts.size(), " DTensor arguments");
      for (size_t k = 0; k < dts.size(); ++k) ch.inputs[k][a] = o.inputs[k];
      for (size_t r = 0; r < n_out; ++r) ch.outputs[r][a] = o.outputs[r];
    }
    try {
      for (size_t r = 0; r < n_out; ++r) {
        if (first_of[r] < first_of[r + 1]) {
          check_placements("rule", ch.outputs[r], static_cast<int64_t>(shapes[first_of[r]].size()), axes);
        }
      }
      if (in_place && (ch.outputs[0] != placements_of(dts[0].second) || ch.inputs[0] != ch.outputs[0]))
        throw ValueError("not in place");
      if (res.valid && !res.valid(ch)) throw ValueError("not computable on blocks");
      double cost = 0;
      for (size_t k = 0; k < dts.size(); ++k) cost += redistribute_plan(dts[k].second, ch.inputs[k])->cost;
      if (!best || cost < best_cost) {
        best_cost = cost;
        best = ch;
      }
    } catch (const ValueError&) {
      // an invalid combination (e.g. mixed Partial ops, a sharded dim the output lacks): skip it
    }
    int a = axes - 1;
    while (a >= 0 && ++pick[a] == res.options.size()) pick[a--] = 0;
    if (a < 0) break;
  }
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

// Plans per (op, arguments' specs) once: later calls with the same key reuse the decision (nullptr: the rule
// does not apply). Per thread (the backward pass may run on autograd's threads); bounded. Shared pointers, so
// a plan in use survives the cache being cleared by a nested call.
std::shared_ptr<const RulePlan> cached_plan(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                            const RuleSpec& spec,
                                            const std::vector<std::pair<size_t, at::Tensor>>& dts,
                                            const MeshPtr& mesh, bool in_place, int out_index) {
  thread_local std::unordered_map<std::string, std::shared_ptr<const RulePlan>> cache;
  auto plan = [&]() -> std::shared_ptr<const RulePlan> {
    std::optional<RulePlan> p = plan_rule(op, args, spec, dts, mesh, in_place);
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

// Runs `op` by its sharding rule (planned by cached_plan): redistributes the inputs, runs on the blocks, and
// wraps the outputs. False when the rule does not apply.
bool run_with_rule(const c10::OperatorHandle& op, torch::jit::Stack* stack, const RuleSpec& spec,
                   const std::vector<std::pair<size_t, at::Tensor>>& dts, const MeshPtr& mesh, bool in_place,
                   const DecisionCheck& check,
                   std::optional<std::pair<size_t, at::Tensor>> out_arg = std::nullopt) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const size_t n_ret = schema.returns().size();
  const size_t base = stack->size() - n_args;
  torch::jit::Stack args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  const int out_index = out_arg ? static_cast<int>(out_arg->first - base) : -1;
  const std::shared_ptr<const RulePlan> plan = cached_plan(op, args, spec, dts, mesh, in_place, out_index);
  if (!plan) return false;
  const RuleResult& res = plan->res;
  const auto& shapes = plan->shapes;
  const auto& first_of = plan->first_of;
  const Choice* best = &plan->best;
  const size_t n_out = first_of.size() - 1;
  if (check.decisions || check.plain) {
    std::string d = str_cat("rule", in_place ? " in place" : "", out_arg ? " out=" : "", ", inputs");
    for (const auto& p : best->inputs) d += " " + to_string(p);
    d += ", outputs";
    for (const auto& p : best->outputs) d += " " + to_string(p);
    check.verify(op, mesh, dts, d);
  }

  // The blocks, redistributed as the choice needs, in place of the DTensors (in dts order).
  size_t k = 0;
  for_each_tensor(args, args.size(), [&](const at::Tensor& t, size_t i) {
    if (out_arg && i == out_arg->first - base) return at::empty({0}, t.options());  // out=: resized by the op
    if (!is_dtensor(t)) return at::Tensor();
    const Placements& want = best->inputs[k];
    const at::Tensor& dt = dts[k++].second;
    return placements_of(dt) == want ? detail::to_local_raw(dt) : detail::redistributed_local(dt, want);
  });
  if (res.localize) res.localize(args, *best, mesh->coordinate());
  stack->resize(base);
  if (res.run) {
    res.run(op, args, *best, mesh);
  } else {
    op.callBoxed(&args);
  }
  if (in_place) {
    stack->push_back(dts[0].second);  // its block was updated in place
    return true;
  }
  std::vector<at::Tensor> locals = returned_tensors(args, n_ret);
  if (res.finish) res.finish(locals, *best, mesh);
  if (out_arg) {  // the out= DTensor takes the result's block, placements and shape (as out= resizes)
    auto expect = local_chunk(shapes[0], mesh->shape(), best->outputs[0], mesh->coordinate()).shape;
    DTRAIN_ASSERT(locals[0].sizes().vec() == expect, op_name(op), " under ", to_string(best->outputs[0]),
                  " gave a block of ", locals[0].sizes(), " where ", c10::IntArrayRef(expect),
                  " was expected");
    at::Tensor out = out_arg->second;
    auto* impl = out.unsafeGetTensorImpl();
    const std::vector<int64_t> strides =
        plan->strides[0].empty() ? detail::dense_strides(shapes[0], {}) : plan->strides[0];
    impl->set_sizes_and_strides(shapes[0], strides);
    impl->set_backend_meta(c10::make_intrusive<detail::DTensorMeta>(
        detail::conform_layout(locals[0], strides), mesh, best->outputs[0]));
    impl->bump_version();
    stack->push_back(out);
    return true;
  }
  std::vector<at::Tensor> wrapped;
  for (size_t r = 0; r < n_out; ++r) {
    for (size_t e = first_of[r]; e < first_of[r + 1]; ++e) {
      const at::Tensor& local = locals[e];
      if (!local.defined()) {
        wrapped.push_back(local);
        continue;
      }
      auto expect = local_chunk(shapes[e], mesh->shape(), best->outputs[r], mesh->coordinate()).shape;
      DTRAIN_ASSERT(local.sizes().vec() == expect, op_name(op), " under ", to_string(best->outputs[r]),
                    " gave a block of ", local.sizes(), " where ", c10::IntArrayRef(expect), " was expected");
      // A fresh block follows its DTensor's layout (a view keeps its base's, which did).
      const bool fresh = schema.returns()[r].alias_info() == nullptr;
      const auto& strides = plan->strides[e];
      wrapped.push_back(
          detail::make_dtensor(fresh && !strides.empty() ? detail::conform_layout(local, strides) : local,
                               mesh, best->outputs[r], shapes[e], strides));
    }
  }
  // Back onto the stack in the returns' structure.
  size_t e = 0;
  for (size_t r = 0; r < n_ret; ++r) {
    const c10::IValue& iv = args[args.size() - n_ret + r];
    if (iv.isTensorList()) {
      c10::List<at::Tensor> list;
      for (size_t j = first_of[r]; j < first_of[r + 1]; ++j) list.push_back(wrapped[e++]);
      stack->emplace_back(list);
    } else {
      stack->emplace_back(wrapped[e++]);
    }
  }
  return true;
}

void handle_on(const c10::OperatorHandle& op, torch::jit::Stack* stack, const MeshPtr& mesh) {
  CommCause cause(op);  // the collectives this op needs are logged under its name
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const size_t base = stack->size() - n_args;

  // Plain tensors other than 0-d ones (scalars) that the op does not write are taken as Replicate on the
  // mesh: the same on every rank, as a constant of the model code is (an arange of positions, a mask); strict
  // and check modes verify that they are. 0-d plain tensors stay scalars.
  DecisionCheck check;
  check.decisions = check_mode();
  check.plains = check.decisions || strict_mode();
  bool plain_only_scalars = true;
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t i) {
    if (!t.defined() || is_dtensor(t) || t.dim() == 0) return at::Tensor();
    const auto* alias = schema.arguments()[i - base].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      plain_only_scalars = false;
      return at::Tensor();
    }
    if (check.plains) check.add_plain(t, i - base);
    return detail::make_dtensor(t, mesh, Placements(mesh->ndim(), Replicate()), t.sizes().vec(), t.strides());
  });

  // The DTensor arguments.
  std::vector<std::pair<size_t, at::Tensor>> dts;  // (stack index, DTensor)
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t i) {
    if (is_dtensor(t)) dts.emplace_back(i, t);
    return at::Tensor();
  });
  for (auto& [i, t] : dts) {
    if (!meta_of(t).mesh->same_layout(*mesh)) {
      throw ValueError(
          str_cat(rank_prefix(), " DTensor: ", op_name(op), " got DTensors on different meshes (",
                  mesh->to_string(), " and ", meta_of(t).mesh->to_string(),
                  "). Combine DTensors of one mesh (the same ranks in the same layout): move one "
                  "with to_local() and from_local() onto the other's mesh first."));
    }
  }

  // Choose how to run it (see the table above).
  const auto n_written = std::count_if(
      schema.arguments().begin(), schema.arguments().end(),
      [](const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); });
  const bool writes = n_written > 0;
  bool all_rep = std::all_of(dts.begin(), dts.end(),
                             [](auto& d) { return all_replicate(meta_of(d.second).placements); });
  // Ops that return no tensor (item(), is_nonzero, equal, ...): on the whole values.
  const bool returns_tensor =
      std::any_of(schema.returns().begin(), schema.returns().end(), [](const auto& r) {
        auto k = r.type()->kind();
        return k == c10::TypeKind::TensorType || k == c10::TypeKind::ListType;
      });
  if (!returns_tensor && !writes && !all_rep) {
    check.verify(op, mesh, dts, "no tensor returned: on the whole values");
    Placements rep(mesh->ndim(), Replicate());
    for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t) {
      return is_dtensor(t) ? detail::redistributed_local(t, rep) : at::Tensor();
    });
    op.callBoxed(stack);
    return;
  }
  // In place with a rule: ops that write only their first argument, a DTensor, and return it.
  bool in_place_self = n_written == 1 && dts[0].first == base && schema.returns().size() == 1 &&
                       schema.arguments()[0].alias_info() != nullptr &&
                       schema.arguments()[0].alias_info()->isWrite();
  if ((!writes || in_place_self) && plain_only_scalars) {
    const RuleSpec* rule = rule_of(op);
    if (rule && (!all_rep || rule->always) &&
        run_with_rule(op, stack, *rule, dts, mesh, in_place_self, check))
      return;
  }
  // out= ops (one written keyword argument `out`, a DTensor, returned): by the rule of the op's functional
  // form, the out DTensor taking the result.
  if (n_written == 1 && schema.returns().size() == 1 && !all_rep && plain_only_scalars) {
    for (size_t k = 0; k < dts.size(); ++k) {
      const auto& arg = schema.arguments()[dts[k].first - base];
      if (!(arg.kwarg_only() && arg.name() == "out" && arg.alias_info() != nullptr)) continue;
      auto inputs = dts;
      inputs.erase(inputs.begin() + static_cast<std::ptrdiff_t>(k));
      const RuleSpec* rule = inputs.empty() ? nullptr : rule_of(op);
      if (rule && run_with_rule(op, stack, *rule, inputs, mesh, false, check, dts[k])) return;
    }
  }
  // Left: ops without a rule for these placements (or writing several arguments). All Replicate: on the
  // blocks; otherwise gathered to Replicate.
  const bool gathered = !all_rep;
  check.verify(op, mesh, dts, gathered ? "no rule: gathered to Replicate" : "all Replicate: on the blocks");
  const Placements out_placements(mesh->ndim(), Replicate());
  if (gathered) {
    ++g_gathers;
    std::string why = "placements ";
    for (size_t k = 0; k < dts.size(); ++k)
      why += str_cat(k ? ", " : "", to_string(meta_of(dts[k].second).placements));
    if (strict_mode()) {
      throw NotSupportedError(
          str_cat(rank_prefix(), " DTensor: ", op_name(op), " has no sharding rule for ", why,
                  " (strict mode, DTRAIN_DTENSOR_STRICT=1). Redistribute the inputs to Replicate() "
                  "first, or unset strict mode to gather automatically."));
    }
    warn_once(op_name(op), why);
  }

  // Swap DTensors for their blocks (or gathered wholes), remembering mutable ones to hand back.
  std::vector<std::pair<size_t, at::Tensor>> originals;  // (stack index, DTensor) for arguments written to
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;  // (DTensor, gathered copy the op may mutate)
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t i) {
    if (!is_dtensor(t)) return at::Tensor();
    const auto* alias = schema.arguments()[i - base].alias_info();
    bool written = alias != nullptr && alias->isWrite();
    at::Tensor local =
        gathered ? detail::to_local_raw(detail::redistribute_raw(t, Placements(mesh->ndim(), Replicate())))
                 : meta_of(t).local;
    if (written) {
      originals.emplace_back(i, t);
      if (gathered) write_back.emplace_back(t, local);
    }
    return local;
  });

  op.callBoxed(stack);

  for (auto& [dt, full] : write_back) {
    const auto& m = meta_of(dt);
    m.local.copy_(local_block(full, m.mesh->shape(), m.placements, m.mesh->coordinate()));
  }
  const size_t n_ret = schema.returns().size();
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& iv = (*stack)[stack->size() - n_ret + r];
    const auto* alias = schema.returns()[r].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      for (auto& [i, dt] : originals) {  // the argument this return aliases
        const auto* a = schema.arguments()[i - base].alias_info();
        if (a != nullptr && a->beforeSets() == alias->beforeSets()) {
          iv = dt;
          break;
        }
      }
      continue;
    }
    auto wrap = [&](const at::Tensor& local) {
      // the op ran on the whole tensors, alike on every rank: the result's own layout is the global one
      return detail::make_dtensor(local, mesh, out_placements, local.sizes().vec(), local.strides());
    };
    if (iv.isTensor()) {
      at::Tensor t = iv.toTensor();
      if (t.defined()) iv = wrap(t);
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, wrap(list.get(j)));
    }
  }
}

void handle(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (detail::handle_on_demand(op, stack)) return;  // a ZeRO-3 parameter (tensor/on_demand.h)
  const size_t n_args = op.schema().arguments().size();
  // The mesh (of the first DTensor argument).
  MeshPtr mesh;
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t) {
    if (!mesh && is_dtensor(t)) mesh = meta_of(t).mesh;
    return at::Tensor();
  });
  DTRAIN_ASSERT(mesh != nullptr, "the DTensor handler ran ", op_name(op), " without a DTensor argument");
  detail::reporting_failures(mesh, [&] { handle_on(op, stack, mesh); });
}

// Reports whether `from`'s implementation may be copied into `self`'s (Tensor::set_data). A DTensor may
// replace a plain tensor's contents (that is how module parameters become DTensors), since all of its state
// travels in the copied metadata. A ZeRO-3 parameter (on demand) is never replaced by anything else: its
// values live in the strategy's shards, which would go on training while the module read the replacement.
bool compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (is_on_demand(self) && !is_on_demand(from)) {
    throw ValueError(
        str_cat(rank_prefix(),
                " a ZeRO-3 parameter (gathered on demand) cannot be replaced by another "
                "tensor (",
                from.toString(), " ", from.sizes(),
                "), as Module::to() or Tensor::set_data() would: its values live in the strategy's "
                "shards. Convert the module (dtype, device) before applying ZeRO-3."));
  }
  return is_dtensor(from) || !is_dtensor(self);
}

}  // namespace

namespace detail {

int64_t gather_count() { return g_gathers.load(); }

void ensure_dispatch_registered() {
  // Registered at the first DTensor rather than at load time, so that a key another extension already
  // claimed is an error naming the fix rather than a crash before main(). The fallback alone loses to
  // CompositeExplicitAutograd kernels (they would run on the DTensor itself and allocate global-size plain
  // outputs), so the handler is registered on each such aten op too, once every op is loaded.
  static std::once_flag once;
  std::call_once(once, [] {
    auto& d = c10::Dispatcher::singleton();
    const auto names = d.getAllOpNames();
    std::string claimed;
    if (d.hasBackendFallbackForDispatchKey(kDTensorKey)) claimed = "a backend fallback";
    for (const auto& name : names) {  // (libtorch itself registers c10d's ops on PrivateUse1: not a claim)
      if (!claimed.empty() || name.name.rfind("aten::", 0) != 0) continue;
      auto h = d.findOp(name);
      if (h && h->hasKernelForDispatchKey(kDTensorKey)) claimed = "a kernel for " + name.name;
    }
    if (!claimed.empty()) {
      throw NotSupportedError(str_cat("DTensor: the dispatch key ", c10::toString(kDTensorKey),
                                      " that this build of dtrain uses is already ",
                                      "claimed by another extension loaded in this process (it registered ",
                                      claimed,
                                      "). Rebuild dtrain with another key, e.g. cmake "
                                      "-DDTRAIN_DISPATCH_KEY=PrivateUse2 (or PrivateUse3)."));
    }
    static torch::Library fallback(torch::Library::IMPL, "_", kDTensorKey, __FILE__, __LINE__);
    fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&handle>());
    static torch::Library lib(torch::Library::IMPL, "aten", kDTensorKey, __FILE__, __LINE__);
    lib.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy_type);
    for (const auto& name : names) {
      auto h = d.findOp(name);
      if (!h || name.name.rfind("aten::", 0) != 0 || h->hasKernelForDispatchKey(kDTensorKey)) continue;
      if (!h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        continue;
      }
      std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&handle>());
    }
  });
}

}  // namespace detail

}  // namespace dtrain::tensor
