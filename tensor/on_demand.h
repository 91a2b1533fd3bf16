// On-demand tensors: a tensor whose values are not held here but made whole for each op that reads them,
// the mechanism under ZeRO-3 (parallel/zero.h): a module's parameter becomes an on-demand tensor whose
// source all-gathers it from every rank's shard just before an op needs it, and lets the copy go after.
//
// An on-demand tensor has the global tensor's sizes, strides and dtype and no storage; it travels on
// DTensor's dispatch key (tensor/dispatch.cpp hands it here), so libtorch code and autograd treat it as an
// ordinary tensor:
// - a view op on it (t(), view, transpose, detach, ...) returns another on-demand tensor that remembers the
//   view, without asking the source: autograd saves such views for backward (linear saves weight.t()) and
//   they cost nothing until used;
// - any other op asks the source for the whole tensor (OnDemandSource::acquire), replays the views on it,
//   and runs on plain tensors; the results are plain. An op that writes it tells the source (written()).
// Combining an on-demand tensor with a DTensor in one op is not supported yet (NotSupportedError).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>

#include <memory>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
struct IValue;
}  // namespace c10

namespace dtrain::tensor {

class OnDemandSource {
 public:
  virtual ~OnDemandSource() = default;
  // The whole value of tensor `index` of this source, a plain tensor with its sizes and strides. It stays
  // valid for the op that asked (the caller holds it).
  virtual at::Tensor acquire(int index) = 0;
  // An op wrote into `whole`, what acquire(index) returned for it: keep the written values.
  virtual void written(int index, const at::Tensor& whole) = 0;
};

// An on-demand tensor for tensor `index` of `source`, with `like`'s sizes, strides and dtype (its values are
// not read). It and its views also carry the tensor-parallel keys among `keys` (tensor/layout_keys.h), so
// that a ZeRO-3 parameter sharded by a tensor-parallel style keeps its style.
at::Tensor make_on_demand(std::shared_ptr<OnDemandSource> source, int index, const at::Tensor& like,
                          c10::DispatchKeySet keys = {});
bool is_on_demand(const at::Tensor& t);
// The whole value of an on-demand tensor (its views replayed), as a plain tensor.
at::Tensor materialize(const at::Tensor& on_demand);

namespace detail {
// The dispatcher handler's part for ops with an on-demand argument; false when there is none.
bool handle_on_demand(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);
}  // namespace detail

}  // namespace dtrain::tensor
