// Small helpers the DTensor handler's files share (dispatch.cpp, rule_plan.cpp, decision_check.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tensor/detail/dtensor_meta.h"

namespace dtrain::tensor::detail {

// "aten::sum.dim_IntList"
inline std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.schema().operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

inline const DTensorMeta& meta_of(const at::Tensor& t) {
  return *static_cast<const DTensorMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

inline bool all_replicate(const Placements& p) {
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

// The tensors of the returned values on top of `stack` (`n_ret` of them), lists flattened.
inline std::vector<at::Tensor> returned_tensors(const torch::jit::Stack& stack, size_t n_ret) {
  std::vector<at::Tensor> out;
  for (size_t i = stack.size() - n_ret; i < stack.size(); ++i) {
    if (stack[i].isTensor()) out.push_back(stack[i].toTensor());
    if (stack[i].isTensorList()) {
      for (const at::Tensor& t : stack[i].toTensorList()) out.push_back(t);
    }
  }
  return out;
}

}  // namespace dtrain::tensor::detail
