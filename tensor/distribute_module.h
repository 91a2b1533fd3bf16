// distribute_module(): turns a torch::nn::Module's parameters into DTensors in place, so that the module's
// own forward code, autograd and torch::optim run on them unchanged.
#pragma once

#include <functional>
#include <string>

#include <torch/nn/module.h>

#include "tensor/dtensor.h"

namespace dtrain::tensor {

// Chooses the placements of one parameter from its qualified name ("0.weight", "attn.proj.bias") and value.
using PlacementFn = std::function<Placements(const std::string& name, const at::Tensor& param)>;

// Replaces every parameter (recursively) by distribute_tensor(value, mesh, fn(name, value)), keeping it the
// same Tensor object (Tensor::set_data), so the module's members and its parameters() see the DTensor.
// Collective: the values of group rank 0 of the mesh are broadcast. A null `fn` replicates every parameter.
void distribute_module(torch::nn::Module& module, MeshPtr mesh, const PlacementFn& fn = nullptr);

}  // namespace dtrain::tensor
