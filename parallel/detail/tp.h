// Tensor parallelism's inside, shared by tensor_parallel.cpp (plans, parameters) and tp_ops.cpp (the kernels
// on the tensor-parallel keys and the region functions around them).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "parallel/tensor_parallel.h"

namespace dtrain::parallel::detail {

// One tensor-parallel group's shared state.
struct TPGroup {
  comm::BackendPtr group;
  bool sequence_parallel = false;
  // The sequence length last split on this rank (by a sequence-parallel embedding or a reduce-scatter), so
  // that the next all-gather knows every rank's part without asking.
  int64_t seq_len = -1;
  // Region inputs made once for several colwise modules reading the same tensor (q, k and v): the source
  // (weakly: its address is not reused while this is held), its version, and the result, weakly too (the
  // modules' saved inputs keep it while a graph needs it; a strong reference would keep the last graph
  // alive), strongly only without autograd.
  struct Region {
    c10::weak_intrusive_ptr<c10::TensorImpl> source{c10::intrusive_ptr<c10::TensorImpl>()};
    uint32_t version = 0;
    bool grad = false;
    c10::weak_intrusive_ptr<c10::TensorImpl> result{c10::intrusive_ptr<c10::TensorImpl>()};
    at::Tensor kept;  // without autograd
  };
  std::vector<Region> regions;  // the last few, newest last
  std::mutex mu;
};

// What a sharded (or, under sequence parallel, a whole) parameter is to its style.
struct ParamRole {
  TPStyle style;
  std::string module;  // "h0.attn.q"
  std::string param;   // "weight"
  int dim = -1;        // the split dim of the parameter; -1: whole
  int64_t start = 0;   // this rank's rows (or columns) of it
  int64_t count = 0;
  int64_t global = 0;  // the whole size of that dim
  std::shared_ptr<TPGroup> tp;
};

// The registry of parameters by TensorImpl (a view is looked up by its base): the kernels ask it which
// style a weight follows.
void register_role(const c10::TensorImpl* impl, ParamRole role);
void unregister_role(const c10::TensorImpl* impl);
// The role of `t`, a parameter or a view of one; nullptr for any other tensor.
std::shared_ptr<const ParamRole> role_of(const at::Tensor& t);

// Registers the kernels on the tensor-parallel keys (once per process).
void ensure_tp_kernels();
// Loss parallel (tp_loss.cpp): `y`, this rank's vocabulary columns [start, start + count) of `global`, marked
// as loss-parallel logits; and the kernels on their key (called by ensure_tp_kernels).
at::Tensor mark_loss_parallel(const at::Tensor& y, const comm::BackendPtr& group, const std::string& module,
                              int64_t start, int64_t count, int64_t global);
void register_loss_parallel_kernels();

// A boxed kernel's argument i of its n (an undefined tensor for None), and its result pushed in their place.
inline at::Tensor arg(torch::jit::Stack* s, size_t n, size_t i) {
  const c10::IValue& v = (*s)[s->size() - n + i];
  return v.isTensor() ? v.toTensor() : at::Tensor();
}
inline void finish(torch::jit::Stack* s, size_t n, at::Tensor out) {
  torch::jit::drop(*s, n);
  torch::jit::push(*s, std::move(out));
}

// Parts of a length split over the group: balanced (core/balanced_split.h).
std::vector<int64_t> split_lengths(int64_t length, int64_t n);

}  // namespace dtrain::parallel::detail
