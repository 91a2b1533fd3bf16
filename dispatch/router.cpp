// The extension key's fallback and routing; see router.h.
#include "dispatch/router.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>
#include <string>

#include "core/error.h"
#include "dispatch/keys.h"
#include "dispatch/on_demand.h"

namespace dtrain::dispatch {

namespace {

std::atomic<OpHandler> g_handler{nullptr};
std::atomic<ShallowCopyCheck> g_check{nullptr};

void route(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (detail::handle_on_demand(op, stack)) return;
  OpHandler handler = g_handler.load();
  if (handler == nullptr) {
    throw NotSupportedError(str_cat("dispatch: ", op.schema().operator_name().name, " reached the key ",
                                    c10::toString(kExtensionKey),
                                    " with no on-demand argument, and no wrapper tensor handler is "
                                    "registered (a tensor made on the key outside dtrain?)."));
  }
  handler(op, stack);
}

// A tensor made on demand is never replaced by anything else (its values live in its source); the wrapper
// tensors decide the rest.
bool compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  detail::check_not_replaced(self, from);
  ShallowCopyCheck check = g_check.load();
  if (check != nullptr) return check(self, from);
  return !self.key_set().has(kExtensionKey) || from.key_set().has(kExtensionKey);
}

std::string op_full_name(const c10::OperatorName& name) {
  return name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
}

}  // namespace

void route_wrapper_tensors(OpHandler handler, ShallowCopyCheck check) {
  g_handler.store(handler);
  g_check.store(check);
}

void ensure_registered() {
  // The fallback alone loses to CompositeExplicitAutograd kernels (they would run on the wrapper tensor
  // itself and allocate global-size plain outputs), so the router is registered on each such aten op too,
  // once every op is loaded.
  static std::once_flag once;
  std::call_once(once, [] {
    auto& d = c10::Dispatcher::singleton();
    const auto names = d.getAllOpNames();
    std::string claimed;
    if (d.hasBackendFallbackForDispatchKey(kExtensionKey)) claimed = "a backend fallback";
    for (const auto& name : names) {  // (libtorch itself registers c10d's ops on PrivateUse1: not a claim)
      if (!claimed.empty() || name.name.rfind("aten::", 0) != 0) continue;
      auto h = d.findOp(name);
      if (h && h->hasKernelForDispatchKey(kExtensionKey)) claimed = "a kernel for " + name.name;
    }
    if (!claimed.empty()) {
      throw NotSupportedError(str_cat("dtrain: the dispatch key ", c10::toString(kExtensionKey),
                                      " that this build of dtrain uses for DTensors and on-demand tensors "
                                      "is already claimed by another extension loaded in this process (it "
                                      "registered ",
                                      claimed,
                                      "). Rebuild dtrain with another key, e.g. cmake "
                                      "-DDTRAIN_DISPATCH_KEY=PrivateUse2 (or PrivateUse3)."));
    }
    static torch::Library fallback(torch::Library::IMPL, "_", kExtensionKey, __FILE__, __LINE__);
    fallback.fallback(torch::CppFunction::makeFromBoxedFunction<&route>());
    static torch::Library lib(torch::Library::IMPL, "aten", kExtensionKey, __FILE__, __LINE__);
    lib.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy_type);
    for (const auto& name : names) {
      auto h = d.findOp(name);
      if (!h || name.name.rfind("aten::", 0) != 0 || h->hasKernelForDispatchKey(kExtensionKey)) continue;
      if (!h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        continue;
      }
      lib.impl(op_full_name(name).c_str(), torch::CppFunction::makeFromBoxedFunction<&route>());
    }
  });
}

}  // namespace dtrain::dispatch
