// On-demand tensors; see on_demand.h.
#include "dispatch/on_demand.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>

#include "core/error.h"
#include "core/log.h"
#include "dispatch/keys.h"
#include "dispatch/router.h"

namespace dtrain::dispatch {

namespace {

// A view op applied to an on-demand tensor, to replay on its whole value: the op and its arguments after
// self.
struct ViewStep {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
};

struct OnDemandMeta : c10::BackendMeta {
  OnDemandMeta(std::shared_ptr<OnDemandSource> source, int index, std::vector<ViewStep> views)
      : source(std::move(source)), index(index), views(std::move(views)) {}
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<OnDemandMeta>(source, index, views);
  }
  std::shared_ptr<OnDemandSource> source;
  int index;
  std::vector<ViewStep> views;
};

// Storage-less, with the global tensor's sizes, strides and offset (`like`'s), on `device`.
struct OnDemandImpl : c10::TensorImpl {
  OnDemandImpl(const at::Tensor& like, c10::Device device, c10::DispatchKeySet extra)
      : c10::TensorImpl(c10::DispatchKeySet(kExtensionKey) | extra, like.dtype(), device) {
    set_storage_access_should_throw();
    set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  }
};

const OnDemandMeta* meta_of(const at::Tensor& t) {
  if (!t.defined() || !t.unsafeGetTensorImpl()->key_set().has(kExtensionKey)) return nullptr;
  return dynamic_cast<const OnDemandMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

at::Tensor make(const at::Tensor& like, c10::Device device, c10::intrusive_ptr<OnDemandMeta> meta,
                c10::DispatchKeySet extra) {
  ensure_registered();
  at::Tensor t = at::detail::make_tensor<OnDemandImpl>(like, device, carried_layout_keys(extra));
  t.unsafeGetTensorImpl()->set_backend_meta(std::move(meta));
  return t;
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.schema().operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

// Visits the tensors of the top `n` stack entries (tensors and lists of them); `f` may return a replacement.
template <typename F>
void for_each_tensor(std::vector<c10::IValue>& stack, size_t n, F&& f) {
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    c10::IValue& iv = stack[i];
    if (iv.isTensor()) {
      if (at::Tensor r = f(iv.toTensor(), i); r.defined()) iv = r;
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        if (at::Tensor r = f(list.get(j), i); r.defined()) list.set(j, r);
      }
    } else if (iv.isOptionalTensorList()) {
      auto list = iv.toOptionalTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        std::optional<at::Tensor> t = list.get(j);
        if (!t) continue;
        if (at::Tensor r = f(*t, i); r.defined()) list.set(j, r);
      }
    }
  }
}

// An op returning one tensor that aliases (without writing) its first argument, its only tensor argument.
bool is_view_of_self(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& stack, size_t base) {
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  if (args.empty() || rets.size() != 1 || rets[0].type()->kind() != c10::TypeKind::TensorType) return false;
  const auto* in = args[0].alias_info();
  const auto* out = rets[0].alias_info();
  if (in == nullptr || out == nullptr || in->isWrite() || out->isWrite()) return false;
  if (in->beforeSets() != out->beforeSets()) return false;
  for (size_t i = base + 1; i < stack.size(); ++i) {
    const c10::IValue& iv = stack[i];
    if (iv.isTensor() || iv.isTensorList() || iv.isOptionalTensorList()) return false;
  }
  return true;
}

}  // namespace

at::Tensor make_on_demand(std::shared_ptr<OnDemandSource> source, int index, const at::Tensor& like,
                          c10::DispatchKeySet keys) {
  if (!source) throw ValueError("make_on_demand: the source is null.");
  return make(like, like.device(),
              c10::make_intrusive<OnDemandMeta>(std::move(source), index, std::vector<ViewStep>{}), keys);
}

bool is_on_demand(const at::Tensor& t) { return meta_of(t) != nullptr; }

namespace {

// The whole value of an on-demand tensor with its views replayed; `acquired` (if given) receives what the
// source gave, before the views.
at::Tensor materialize_with(const at::Tensor& t, at::Tensor* acquired) {
  const OnDemandMeta* m = meta_of(t);
  if (m == nullptr) {
    throw ValueError(str_cat("materialize: the tensor is not an on-demand tensor (",
                             t.defined() ? t.toString() : "undefined", ")."));
  }
  at::Tensor whole = m->source->acquire(m->index);
  if (acquired != nullptr) *acquired = whole;
  for (const ViewStep& v : m->views) {
    std::vector<c10::IValue> stack;
    stack.reserve(v.args.size() + 1);
    stack.emplace_back(whole);
    stack.insert(stack.end(), v.args.begin(), v.args.end());
    v.op.callBoxed(&stack);
    whole = stack.front().toTensor();
  }
  return whole;
}

}  // namespace

at::Tensor materialize(const at::Tensor& t) { return materialize_with(t, nullptr); }

namespace detail {

bool handle_on_demand(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const size_t base = stack->size() - n_args;
  const OnDemandMeta* first = nullptr;
  bool any_other = false;  // another tensor on the extension key (a DTensor)
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t) {
    if (const OnDemandMeta* m = meta_of(t); m != nullptr) {
      if (first == nullptr) first = m;
    } else if (t.defined() && t.key_set().has(kExtensionKey)) {
      any_other = true;
    }
    return at::Tensor();
  });
  if (first == nullptr) return false;
  if (any_other) {
    throw NotSupportedError(str_cat(rank_prefix(), " ", op_name(op), " got both ", first->source->describe(),
                                    " and a DTensor: an op takes on-demand tensors or DTensors, not both. "
                                    "Make a module's parameters one or the other."));
  }

  // A view: another on-demand tensor, its metadata from the op on a meta tensor.
  if (const OnDemandMeta* m = meta_of((*stack)[base].isTensor() ? (*stack)[base].toTensor() : at::Tensor());
      m != nullptr && is_view_of_self(schema, *stack, base)) {
    const at::Tensor self = (*stack)[base].toTensor();
    std::vector<c10::IValue> rest(stack->begin() + static_cast<std::ptrdiff_t>(base) + 1, stack->end());
    std::vector<c10::IValue> meta_stack;
    meta_stack.emplace_back(at::empty({0}, self.options().device(at::kMeta))
                                .as_strided(self.sizes(), self.strides(), self.storage_offset()));
    meta_stack.insert(meta_stack.end(), rest.begin(), rest.end());
    op.callBoxed(&meta_stack);
    const at::Tensor shape = meta_stack.front().toTensor();
    std::vector<ViewStep> views = m->views;
    views.push_back(ViewStep{op, std::move(rest)});
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
    stack->emplace_back(make(shape, self.device(),
                             c10::make_intrusive<OnDemandMeta>(m->source, m->index, std::move(views)),
                             self.key_set()));
    return true;
  }

  // Anything else: on the whole values.
  std::vector<std::pair<size_t, at::Tensor>> written;  // (stack index, on-demand argument written)
  std::vector<at::Tensor> written_whole;               // what the source gave for each of them
  for_each_tensor(*stack, n_args, [&](const at::Tensor& t, size_t i) {
    if (meta_of(t) == nullptr) return at::Tensor();
    const auto* alias = schema.arguments()[i - base].alias_info();
    if (alias == nullptr || !alias->isWrite()) return materialize(t);
    written.emplace_back(i, t);
    written_whole.emplace_back();
    return materialize_with(t, &written_whole.back());
  });
  op.callBoxed(stack);
  for (size_t k = 0; k < written.size(); ++k) {
    const OnDemandMeta* m = meta_of(written[k].second);
    m->source->written(m->index, written_whole[k]);
  }
  const size_t n_ret = schema.returns().size();
  for (size_t r = 0; r < n_ret; ++r) {
    const auto* alias = schema.returns()[r].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    for (const auto& [i, t] : written) {  // the argument this return aliases gets its own tensor back
      const auto* a = schema.arguments()[i - base].alias_info();
      if (a != nullptr && a->beforeSets() == alias->beforeSets()) {
        (*stack)[stack->size() - n_ret + r] = t;
        break;
      }
    }
  }
  return true;
}

void check_not_replaced(const at::Tensor& self, const at::Tensor& from) {
  const OnDemandMeta* m = meta_of(self);
  if (m == nullptr || meta_of(from) != nullptr) return;
  throw ValueError(str_cat(rank_prefix(), " ", m->source->describe(),
                           " cannot be replaced by another tensor (", from.toString(), " ", from.sizes(),
                           "), as Module::to() or Tensor::set_data() would: its values live in its source. ",
                           m->source->replace_fix()));
}

}  // namespace detail

}  // namespace dtrain::dispatch
