// The dispatch keys of tensor parallelism (parallel/tensor_parallel.h), beside DTensor's (kDTensorKey): two
// functionality keys that sit above autograd, so that a kernel registered on them sees an op before autograd
// records it and can wrap it in the block's collectives. libtorch reserves them for wrapper tensors and
// registers nothing on them.
// - kTensorParallelKey: carried by a parameter sharded by a tensor-parallel style (and by its views); every
//   op but the few that read a sharded weight falls through it at no cost.
// - kLossParallelKey: carried by loss-parallel logits (each rank holds its part of the vocabulary); only
// views
//   and cross_entropy may read them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorImpl.h>

namespace dtrain::tensor {

constexpr c10::DispatchKey kTensorParallelKey = c10::DispatchKey::TESTING_ONLY_GenericWrapper;
constexpr c10::DispatchKey kLossParallelKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// The keys a tensor made from another (an on-demand view, a ZeRO parameter's new home) keeps.
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

}  // namespace dtrain::tensor
