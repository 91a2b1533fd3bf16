// The one fallback on the extension key (dispatch/keys.h), and the routing behind it: an op with an on-demand
// argument goes to on-demand tensors (dispatch/on_demand.h), any other op on the key to the handler of the
// wrapper tensors that registered (DTensor's, tensor/dispatch.cpp). Registered at the first tensor made on
// the key rather than at load time, so that a key another extension already claimed is an error naming the
// fix rather than a crash before main().
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace c10 {
class OperatorHandle;
struct IValue;
}  // namespace c10

namespace dtrain::dispatch {

// Runs `op` on the stack's top (its arguments), leaving its returns there.
using OpHandler = void (*)(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);
// Whether `from`'s implementation may be copied into `self`'s (Tensor::set_data), for wrapper tensors.
using ShallowCopyCheck = bool (*)(const at::Tensor& self, const at::Tensor& from);

// Registers the fallback and the per-op kernels once; throws NotSupportedError when another extension in
// this process claimed the key first.
void ensure_registered();

// The handler of the wrapper tensors on the key (one per process: DTensor's); set once, before its first
// tensor is made.
void route_wrapper_tensors(OpHandler handler, ShallowCopyCheck check);

}  // namespace dtrain::dispatch
