// The DTensor dispatcher handler (DESIGN §4, "Transparent execution"): every aten op on a DTensor reaches
// handle() through the router of the extension key (dispatch/router.h: its fallback, and per-op kernels on
// the ops whose CompositeExplicitAutograd kernels would otherwise run first and allocate global-size plain
// tensors).
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

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "comm/comm_log.h"
#include "core/error.h"
#include "core/log.h"
#include "dispatch/router.h"
#include "tensor/detail/decision_check.h"
#include "tensor/detail/dispatch_util.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/detail/observe.h"
#include "tensor/detail/rule_plan.h"
#include "tensor/detail/view_sync.h"
#include "tensor/redistribute.h"
#include "tensor/settings.h"
#include "tensor/shard_math.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor {

namespace {

using detail::all_replicate;
using detail::cached_plan;
using detail::DecisionCheck;
using detail::for_each_tensor;
using detail::infer_outputs;
using detail::meta_of;
using detail::op_name;
using detail::Outputs;
using detail::returned_tensors;
using detail::rule_of;
using detail::RulePlan;

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

std::atomic<int64_t> g_gathers{0};

// Return `r` of the op is a view of an argument (Tensor(a) without a write): the argument's index, or -1.
int viewed_argument(const c10::FunctionSchema& schema, size_t r) {
  const auto* ret = schema.returns()[r].alias_info();
  if (ret == nullptr || ret->isWrite()) return -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto* a = schema.arguments()[i].alias_info();
    if (a != nullptr && !a->isWrite() && a->beforeSets() == ret->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

// Any return is a view (looked up once per op: every call asks).
bool returns_view(const c10::FunctionSchema& schema) {
  thread_local std::unordered_map<const void*, bool> views;
  auto it = views.find(&schema);
  if (it != views.end()) return it->second;
  bool view = false;
  for (size_t r = 0; r < schema.returns().size() && !view; ++r) view = viewed_argument(schema, r) >= 0;
  return views[&schema] = view;
}

std::string choice_string(const Choice& c) {
  std::string d = "inputs";
  for (const auto& p : c.inputs) d += " " + to_string(p);
  d += ", outputs";
  for (const auto& p : c.outputs) d += " " + to_string(p);
  return d;
}

// A solved plan's choice for this call (FollowPlan): one the rule allows for these arguments, or a ValueError
// naming the op's position, the choice and what was possible.
const Choice& planned_choice(const c10::OperatorHandle& op, const RulePlan& plan, const Choice& planned,
                             const std::vector<std::pair<size_t, at::Tensor>>& dts, bool in_place) {
  for (const Choice& c : plan.choices) {
    if (c.inputs == planned.inputs && c.outputs == planned.outputs) return c;
  }
  std::string shapes;
  for (const auto& [i, t] : dts) shapes += str_cat(shapes.empty() ? "" : " ", t.sizes());
  std::string why;
  if (in_place && !planned.inputs.empty() && planned.inputs[0] != placements_of(dts[0].second)) {
    why = str_cat(" It writes its first argument in place, which has placements ",
                  to_string(placements_of(dts[0].second)),
                  " here: place the parameters and the optimizer's "
                  "state as the plan says before following it (plan::place_values).");
  }
  throw ValueError(
      str_cat(rank_prefix(), " DTensor: following the solved plan, op #", detail::planned_position(), " ",
              op_name(op), " should run with ", choice_string(planned),
              ", which its sharding rule does not allow for these arguments (shapes ", shapes, "; it allows ",
              plan.choices.size(), " ways, e.g. ",
              plan.choices.empty() ? std::string("none") : choice_string(plan.choices[0]), ").",
              why.empty() ? " The step differs from the one recorded: record and solve it again." : why));
}

// Runs `op` by its sharding rule (planned by cached_plan): redistributes the inputs, runs on the blocks, and
// wraps the outputs, with the cheapest choice for this op, or `planned` (a solved plan's). False when the
// rule does not apply.
bool run_with_rule(const c10::OperatorHandle& op, torch::jit::Stack* stack, const RuleSpec& spec,
                   const std::vector<std::pair<size_t, at::Tensor>>& dts, const MeshPtr& mesh, bool in_place,
                   const DecisionCheck& check,
                   std::optional<std::pair<size_t, at::Tensor>> out_arg = std::nullopt,
                   const Choice* planned = nullptr) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const size_t n_ret = schema.returns().size();
  const size_t base = stack->size() - n_args;
  torch::jit::Stack args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  const int out_index = out_arg ? static_cast<int>(out_arg->first - base) : -1;
  const std::shared_ptr<const RulePlan> plan =
      cached_plan(op, args, spec, dts, mesh, in_place, out_index, base);
  if (!plan) return false;
  const RuleResult& res = plan->res;
  const auto& shapes = plan->shapes;
  const auto& first_of = plan->first_of;
  const Choice* best = planned ? &planned_choice(op, *plan, *planned, dts, in_place) : &plan->best;
  const size_t n_out = first_of.size() - 1;
  if (check.decisions || check.plain) {
    check.verify(op, mesh, dts,
                 str_cat("rule", in_place ? " in place" : "", out_arg ? " out=" : "",
                         planned ? " planned" : "", ", ", choice_string(*best)));
  }

  // The blocks, redistributed as the choice needs, in place of the DTensors (in dts order). A view op gets a
  // copy of its own (never a kept copy, which a write through the view would change).
  const bool view_op = returns_view(schema);
  std::vector<bool> moved(dts.size(), false);  // redistributed
  size_t k = 0;
  for_each_tensor(args, args.size(), [&](const at::Tensor& t, size_t i) {
    if (out_arg && i == out_arg->first - base) return at::empty({0}, t.options());  // out=: resized by the op
    if (!is_dtensor(t)) return at::Tensor();
    const Placements& want = best->inputs[k];
    const at::Tensor& dt = dts[k].second;
    if (placements_of(dt) == want) return detail::to_local_raw(dts[k++].second);
    moved[k++] = true;
    return view_op ? detail::to_local_raw(detail::redistribute_raw(dt, want))
                   : detail::redistributed_local(dt, want);
  });
  if (res.localize) res.localize(args, *best, mesh->coordinate());
  stack->resize(base);
  if (res.run) {
    res.run(op, args, *best, mesh);
  } else {
    op.callBoxed(&args);
  }
  if (in_place) {
    detail::after_write(dts[0].second);  // its block was updated in place
    stack->push_back(dts[0].second);
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
    auto view = meta_of(out).view;
    if (view) {  // out= into a view: the values go where the view sits, and on into its root
      if (out.sizes().vec() != shapes[0]) {
        throw NotSupportedError(
            str_cat(rank_prefix(), " DTensor: ", op_name(op), " writes a result of shape ",
                    c10::IntArrayRef(shapes[0]), " into out=, a view of shape ", out.sizes(),
                    " of another DTensor; a view cannot be resized. Pass an "
                    "out= tensor of the result's shape, or write the result with copy_()."));
      }
      view = std::make_shared<detail::ViewOf>(*view);
      view->aliases = false;  // the block is the result's, no longer a view of the root's
      impl->set_backend_meta(c10::make_intrusive<detail::DTensorMeta>(
          detail::conform_layout(locals[0], out.strides()), mesh, best->outputs[0], view));
    } else {
      const std::vector<int64_t> strides =
          plan->strides[0].empty() ? detail::dense_strides(shapes[0], {}) : plan->strides[0];
      impl->set_sizes_and_strides(shapes[0], strides);
      impl->set_backend_meta(c10::make_intrusive<detail::DTensorMeta>(
          detail::conform_layout(locals[0], strides), mesh, best->outputs[0]));
    }
    impl->bump_version();
    detail::after_write(out);
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
                               mesh, best->outputs[r], shapes[e], strides, plan->offsets[e]));
      // A view remembers what it views; its block aliases that tensor's only when the op ran on the block
      // itself.
      const int viewed = viewed_argument(schema, r);
      for (size_t j = 0; viewed >= 0 && j < dts.size(); ++j) {
        if (dts[j].first - base != static_cast<size_t>(viewed)) continue;
        detail::mark_view(wrapped.back(), dts[j].second, !moved[j] && !res.run);
        break;
      }
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

// The functional form of an in-place op (relu_ -> relu, add_.Tensor -> add.Tensor, fill_.Scalar ->
// fill.Scalar): same overload and arguments, the first one not written.
std::optional<c10::OperatorHandle> in_place_form_of(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const std::string& name = schema.name();
  if (name.size() < 2 || name.back() != '_') return std::nullopt;
  auto h = c10::Dispatcher::singleton().findOp({name.substr(0, name.size() - 1), schema.overload_name()});
  if (!h || h->schema().arguments().size() != schema.arguments().size()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    if (*h->schema().arguments()[i].type() != *schema.arguments()[i].type()) return std::nullopt;
  }
  return h;
}

// Runs in-place `op` (writing its first argument, dts[0]) as its functional form by that form's rule, then
// redistributes the result to the argument's placements and copies it into the argument's block. False when
// the functional form has no rule that applies.
bool in_place_functionally(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           const std::vector<std::pair<size_t, at::Tensor>>& dts, const MeshPtr& mesh,
                           const DecisionCheck& check) {
  auto functional = in_place_form_of(op);
  const RuleSpec* rule = functional ? rule_of(*functional) : nullptr;
  if (!rule) return false;
  const size_t n_args = op.schema().arguments().size();
  const size_t base = stack->size() - n_args;
  torch::jit::Stack call(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  std::vector<std::pair<size_t, at::Tensor>> moved;
  for (const auto& [i, t] : dts) moved.emplace_back(i - base, t);
  if (!run_with_rule(*functional, &call, *rule, moved, mesh, false, check)) return false;
  const at::Tensor self = dts[0].second;
  const at::Tensor result = call.back().toTensor();
  if (result.sizes() != self.sizes() || !c10::canCast(result.scalar_type(), self.scalar_type())) {
    throw ValueError(str_cat(rank_prefix(), " DTensor: ", op_name(op), " in place gives a result of shape ",
                             result.sizes(), " and dtype ", result.scalar_type(), " for a tensor of shape ",
                             self.sizes(), " and dtype ", self.scalar_type(),
                             ", which it cannot hold (libtorch refuses this too). Use the out-of-place op."));
  }
  const Placements& want = placements_of(self);
  at::Tensor block = placements_of(result) == want
                         ? detail::to_local_raw(result)
                         : detail::to_local_raw(detail::redistribute_raw(result, want));
  meta_of(self).local.copy_(block);
  detail::after_write(self);
  stack->resize(base);
  stack->emplace_back(self);
  return true;
}

void handle_on(const c10::OperatorHandle& op, torch::jit::Stack* stack, const MeshPtr& mesh) {
  comm::CommCause cause(op);  // the collectives this op needs are logged under its name
  const Choice* planned = detail::next_planned(op);  // following a solved plan: its choice for this op
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
  for (auto& [i, t] : dts) detail::sync_view(t);  // a view whose root changed since it was made

  // Choose how to run it (see the table above).
  const bool view_op = returns_view(schema);
  // Every block sits in its storage as its DTensor in the global layout (a Replicate root and its aliasing
  // views): a view op run on the blocks then gives the global geometry itself.
  const bool blocks_as_global = std::all_of(dts.begin(), dts.end(), [](const auto& d) {
    const at::Tensor& local = meta_of(d.second).local;
    return local.strides() == d.second.strides() && local.storage_offset() == d.second.storage_offset();
  });
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
  if (planned) {  // by the rule, with the plan's choice, whatever the inputs' placements
    const RuleSpec* rule = (!writes || in_place_self) && plain_only_scalars ? rule_of(op) : nullptr;
    if (rule && run_with_rule(op, stack, *rule, dts, mesh, in_place_self, check, std::nullopt, planned))
      return;
    throw ValueError(str_cat(rank_prefix(), " DTensor: following the solved plan, op #",
                             detail::planned_position(), " ", op_name(op),
                             " should run by its sharding rule with ", choice_string(*planned), ", but ",
                             !plain_only_scalars        ? "it writes a plain tensor"
                             : writes && !in_place_self ? "it writes an argument other than its first"
                                                        : "no rule applies to these arguments",
                             " here. The step differs from the one recorded: record and solve it again."));
  }
  if ((!writes || in_place_self) && plain_only_scalars) {
    const RuleSpec* rule = rule_of(op);
    // (A view op on Replicate blocks laid out otherwise than their DTensors goes by its rule: its result
    // needs its global geometry.)
    if (rule && (!all_rep || rule->always || (view_op && !blocks_as_global)) &&
        run_with_rule(op, stack, *rule, dts, mesh, in_place_self, check))
      return;
    // In place where no option keeps the tensor's placements (relu_ on a Partial, fill_ on Partial(sum)):
    // the functional form by its rule, its result redistributed into the tensor's block.
    if (in_place_self && !all_rep && in_place_functionally(op, stack, dts, mesh, check)) return;
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

  // A view op without a rule: its outputs' global geometry, before the DTensors are swapped out (on blocks
  // laid out as their DTensors, the blocks' own).
  Outputs geometry;
  if (view_op && (gathered || !blocks_as_global)) {
    torch::jit::Stack args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
    geometry = infer_outputs(op, args, dts);
  }
  const std::vector<std::pair<size_t, at::Tensor>> inputs = dts;

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
  for (auto& [i, dt] : originals) {
    // An out= argument the op resized on Replicate blocks: the DTensor takes the block's shape.
    const at::Tensor& local = meta_of(dt).local;
    if (!gathered && local.sizes() != dt.sizes() && all_replicate(meta_of(dt).placements)) {
      dt.unsafeGetTensorImpl()->set_sizes_and_strides(local.sizes(), local.strides());
    }
    detail::after_write(dt);
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
    const int viewed = viewed_argument(schema, r);
    size_t e = r;  // (views returned in a list are not tracked: no rule-less op returns one)
    auto wrap = [&](const at::Tensor& local) {
      if (viewed < 0) {
        // the op ran on the whole tensors, alike on every rank: the result's own layout is the global one
        return detail::make_dtensor(local, mesh, out_placements, local.sizes().vec(), local.strides());
      }
      const bool known = e < geometry.shapes.size() && geometry.shapes[e] == local.sizes().vec();
      at::Tensor out = known ? detail::make_dtensor(local, mesh, out_placements, geometry.shapes[e],
                                                    geometry.strides[e], geometry.offsets[e])
                             : detail::make_dtensor(local, mesh, out_placements, local.sizes().vec(),
                                                    local.strides(), local.storage_offset());
      for (const auto& [i, dt] : inputs) {
        if (i - base == static_cast<size_t>(viewed)) detail::mark_view(out, dt, !gathered);
      }
      return out;
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

// DTensor's handler, which the extension key's router (dispatch/router.h) calls for every op on a DTensor.
void handle(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n_args = op.schema().arguments().size();
  // The mesh (of the first DTensor argument).
  MeshPtr mesh;
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t) {
    if (!mesh && is_dtensor(t)) mesh = meta_of(t).mesh;
    return at::Tensor();
  });
  DTRAIN_ASSERT(mesh != nullptr, "the DTensor handler ran ", op_name(op), " without a DTensor argument");
  if (!detail::observing() && !detail::following()) {
    detail::reporting_failures(mesh, [&] { handle_on(op, stack, mesh); });
    return;
  }
  detail::observed(op, stack, [&] { detail::reporting_failures(mesh, [&] { handle_on(op, stack, mesh); }); });
}

// Whether `from`'s implementation may be copied into `self`'s (Tensor::set_data). A DTensor may replace a
// plain tensor's contents (that is how module parameters become DTensors), since all of its state travels in
// the copied metadata.
bool compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return is_dtensor(from) || !is_dtensor(self);
}

}  // namespace

namespace detail {

int64_t gather_count() { return g_gathers.load(); }

void ensure_dispatch_registered() {
  static std::once_flag once;
  std::call_once(once, [] { dispatch::route_wrapper_tensors(&handle, &compatible_shallow_copy_type); });
  dispatch::ensure_registered();
}

}  // namespace detail

}  // namespace dtrain::tensor
