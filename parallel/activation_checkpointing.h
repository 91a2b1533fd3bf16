// Activation checkpointing, the C++ counterpart of torch.utils.checkpoint: a block's forward runs without
// keeping its intermediate activations (only its input); backward runs the block again on the saved input,
// with the same random state (dropout), and differentiates that recomputation. Memory falls from every
// activation inside the block to its input; compute grows by one forward of the block.
//
// A module opts in by deriving nn::ActivationCheckpointable (nn/activation_checkpointable.h) and running its
// body through run_body(); checkpoint_activations() (or ParallelConfig::activation_checkpointing) switches
// the modules that patterns name.
//
// The gradients of the block's parameters come back through the recomputation's own autograd node, so that
// they are accumulated by the outer backward like any other's (data parallel's and ZeRO's gradient hooks
// fire as usual; the recomputation's inner backward accumulates nothing). Collectives inside the block
// (tensor parallel, ZeRO-3's gathers) run again in the recomputation, on every rank alike.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nn/activation_checkpointable.h"

namespace dtrain::parallel {

// `body`(x), its activations recomputed in backward. `body` must outlive the backward (a module's member).
// Without grad mode, or when neither x nor params require grad, it is body(x).
at::Tensor recompute_in_backward(const nn::BlockBody& body, const at::Tensor& x,
                                 const std::vector<at::Tensor>& params);

// Switches activation checkpointing on for the submodules of `module` that `patterns` name ("h*": '*' within
// one name component). Each must derive nn::ActivationCheckpointable; a pattern naming no module, or one that
// cannot recompute, is a ValueError, checked before anything is switched.
void checkpoint_activations(torch::nn::Module& module, const std::vector<std::string>& patterns);

// Recomputations run in this process so far (each backward through a checkpointed block adds one): for tests.
int64_t activation_recomputations();

}  // namespace dtrain::parallel
