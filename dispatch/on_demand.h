// On-demand tensors: a tensor whose values are not held here but made whole for each op that reads them,
// by a source that the caller provides. (ZeRO-3, parallel/zero.h, makes each module parameter one whose
// source all-gathers it from every rank's shard just before an op needs it, and lets the copy go after.)
//
// An on-demand tensor has the global tensor's sizes, strides and dtype and no storage; it travels on the
// extension key (dispatch/keys.h; the router, dispatch/router.h, hands it here), so libtorch code and
// autograd treat it as an ordinary tensor:
// - a view op on it (t(), view, transpose, detach, ...) returns another on-demand tensor that remembers the
//   view, without asking the source: autograd saves such views for backward (linear saves weight.t()) and
//   they cost nothing until used;
// - any other op asks the source for the whole tensor (OnDemandSource::acquire), replays the views on it,
//   and runs on plain tensors; the results are plain. An op that writes it tells the source (written()).
// Combining an on-demand tensor with another tensor on the extension key (a DTensor) in one op is refused
// (NotSupportedError).
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

namespace dtrain::dispatch {

class OnDemandSource {
 public:
  virtual ~OnDemandSource() = default;
  // The whole value of tensor `index` of this source, a plain tensor with its sizes and strides. It stays
  // valid for the op that asked (the caller holds it).
  virtual at::Tensor acquire(int index) = 0;
  // An op wrote into `whole`, what acquire(index) returned for it: keep the written values.
  virtual void written(int index, const at::Tensor& whole) = 0;
  // What its tensors are, for errors: e.g. "a ZeRO-3 parameter (gathered on demand)".
  virtual std::string describe() const = 0;
  // How to avoid replacing one (Module::to(), Tensor::set_data()), for that error.
  virtual std::string replace_fix() const = 0;
};

// An on-demand tensor for tensor `index` of `source`, with `like`'s sizes, strides and dtype (its values are
// not read). It and its views also carry the layout keys among `keys` (dispatch/keys.h), so that a parameter
// sharded by a tensor-parallel style keeps its style.
at::Tensor make_on_demand(std::shared_ptr<OnDemandSource> source, int index, const at::Tensor& like,
                          c10::DispatchKeySet keys = {});
bool is_on_demand(const at::Tensor& t);
// The whole value of an on-demand tensor (its views replayed), as a plain tensor.
at::Tensor materialize(const at::Tensor& on_demand);

namespace detail {
// The router's part for ops with an on-demand argument (the stack's top holds the op's arguments); false when
// there is none. Another argument on the extension key that is not on demand is an error.
bool handle_on_demand(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);
// Tensor::set_data() from `from` into `self`: refused when `self` is on demand and `from` is not.
void check_not_replaced(const at::Tensor& self, const at::Tensor& from);
}  // namespace detail

}  // namespace dtrain::dispatch
