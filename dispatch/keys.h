// The dispatch keys dtrain's tensors ride (docs/architecture.md, "Dispatch keys"):
// - kExtensionKey: carried by DTensors (tensor/) and by on-demand tensors (dispatch/on_demand.h); the one
//   fallback on it (dispatch/router.h) hands each op to the owner of its arguments. It is the CMake option
//   DTRAIN_DISPATCH_KEY (PrivateUse1, PrivateUse2 or PrivateUse3), for a process where another extension
//   claims PrivateUse1.
// - two layout keys, functionality keys that sit above autograd, so that a kernel registered on them sees an
//   op before autograd records it and can wrap it in the block's collectives (tensor parallelism,
//   parallel/tensor_parallel.h). libtorch reserves them for wrapper tensors in its own tests and registers
//   nothing on them; keys_test.cpp fails when that changes, and the static_asserts below fail the build when
//   they move below autograd or are renamed.
//   - kTensorParallelKey: carried by a parameter sharded by a tensor-parallel style (and by its views); every
//     op but the few that read a sharded weight falls through it at no cost.
//   - kLossParallelKey: carried by loss-parallel logits (each rank holds its part of the vocabulary); only
//     views and cross_entropy may read them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorImpl.h>

#ifndef DTRAIN_DISPATCH_KEY
#define DTRAIN_DISPATCH_KEY PrivateUse1
#endif

namespace dtrain::dispatch {

constexpr c10::DispatchKey kExtensionKey = c10::DispatchKey::DTRAIN_DISPATCH_KEY;

constexpr c10::DispatchKey kTensorParallelKey = c10::DispatchKey::TESTING_ONLY_GenericWrapper;
constexpr c10::DispatchKey kLossParallelKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// The layout keys must be functionality keys (not per-backend ones) that the dispatcher tries before
// autograd: otherwise autograd records the op first, and a tensor-parallel block's collectives would not be
// wrapped around it. A libtorch that reorders or renames them fails here, at build time.
static_assert(!c10::isPerBackendFunctionalityKey(kTensorParallelKey) &&
                  !c10::isPerBackendFunctionalityKey(kLossParallelKey),
              "dtrain's layout keys must be functionality keys (dispatch/keys.h)");
static_assert(kTensorParallelKey > c10::DispatchKey::AutogradOther &&
                  kLossParallelKey > c10::DispatchKey::AutogradOther,
              "dtrain's layout keys must be dispatched before autograd (dispatch/keys.h)");

// The layout keys among `ks`: what a tensor made from another (an on-demand view, a sharded parameter's new
// home) keeps.
inline c10::DispatchKeySet carried_layout_keys(const c10::DispatchKeySet& ks) {
  return ks & c10::DispatchKeySet({kTensorParallelKey, kLossParallelKey});
}

// `t`, or an alias of it (same storage, sizes and strides, no autograd history) that also carries the layout
// keys among `keys`.
inline at::Tensor with_layout_keys(const at::Tensor& t, c10::DispatchKeySet keys) {
  keys = carried_layout_keys(keys);
  if (keys.empty() || (t.key_set() & keys) == keys) return t;
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set() | keys, t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

}  // namespace dtrain::dispatch
