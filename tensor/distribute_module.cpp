// distribute_module; see distribute_module.h.
#include "tensor/distribute_module.h"

#include <ATen/ATen.h>

namespace dtrain::tensor {

void distribute_module(torch::nn::Module& module, MeshPtr mesh, const PlacementFn& fn) {
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor& param = item.value();
    if (is_dtensor(param)) continue;
    Placements placements = fn ? fn(item.key(), param) : Placements(mesh->ndim(), Replicate());
    at::NoGradGuard no_grad;
    param.set_data(distribute_tensor(param.detach(), mesh, placements));
  }
}

}  // namespace dtrain::tensor
