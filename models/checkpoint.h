// Activation checkpointing for any part of a model, the C++ counterpart of torch.utils.checkpoint: forward
// runs `body` without keeping its intermediate activations (only its input); backward runs `body` again on
// the saved input, with the same random state (dropout), and differentiates that recomputation. Memory falls
// from every activation inside `body` to its input; compute grows by one forward of `body`.
//
//   struct BlockImpl : torch::nn::Module {
//     at::Tensor forward(const at::Tensor& x) {
//       return checkpoint_ ? models::checkpoint(body_, x, parameters()) : body_(x);
//     }
//     models::CheckpointBody body_ = [this](const at::Tensor& x) { ... };  // outlives every backward
//   };
//
// The gradients of `params` (the parameters `body` reads: a module's parameters()) come back through this
// call's own autograd node, so that they are accumulated by the outer backward like any other's (data
// parallel's and ZeRO's gradient hooks fire as usual; the recomputation's inner backward accumulates
// nothing). Collectives inside `body` (tensor parallel, ZeRO-3's gathers) run again in the recomputation,
// on every rank alike.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace dtrain::models {

using CheckpointBody = std::function<at::Tensor(const at::Tensor&)>;

// A module that can recompute its activations in backward (it calls checkpoint() itself when on):
// parallel::ParallelConfig::checkpoint switches the modules its patterns name.
struct Checkpointable {
  virtual ~Checkpointable() = default;
  virtual void set_checkpointing(bool on) = 0;
};

// `body`(x), its activations recomputed in backward. `body` must outlive the backward (a module's member).
// Without grad mode, or when neither x nor params require grad, it is body(x).
at::Tensor checkpoint(const CheckpointBody& body, const at::Tensor& x, const std::vector<at::Tensor>& params);

// Recomputations run in this process so far (each backward through a checkpoint adds one): for tests.
int64_t checkpoint_recomputations();

}  // namespace dtrain::models
