// What a DTensor's TensorImpl carries (in its BackendMeta): the local block, the mesh and the placements.
#pragma once

#include <c10/core/TensorImpl.h>

#include <map>

#include "tensor/dtensor.h"

namespace dtrain::tensor::detail {

struct DTensorMeta : c10::BackendMeta {
  DTensorMeta(at::Tensor local, MeshPtr mesh, Placements placements)
      : local(std::move(local)), mesh(std::move(mesh)), placements(std::move(placements)) {}
  // set_data()/detach() copy the metadata: the copy shares the same local block, as a detached tensor shares
  // storage.
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<DTensorMeta>(local, mesh, placements);
  }

  at::Tensor local;
  MeshPtr mesh;
  Placements placements;

  // Blocks of this tensor already redistributed for some op, reused while neither the DTensor nor its block
  // changed (both version counters): an optimizer reading a Partial gradient in three ops reduces it once.
  struct Cached {
    uint32_t version, local_version;
    at::Tensor local;
  };
  mutable std::map<Placements, Cached> redistributed;
};

// Builds a DTensor from parts already checked.
at::Tensor make_dtensor(at::Tensor local, MeshPtr mesh, Placements placements,
                        std::vector<int64_t> global_shape);
// The non-differentiable cores of to_local, from_local and redistribute (dtensor.cpp); the public functions
// wrap them in autograd functions (dtensor_autograd.cpp).
at::Tensor to_local_raw(const at::Tensor& dtensor);
at::Tensor from_local_raw(const at::Tensor& local, MeshPtr mesh, Placements placements,
                          std::optional<std::vector<int64_t>> global_shape);
at::Tensor redistribute_raw(const at::Tensor& dtensor, const Placements& placements);
// The block of `dtensor` under `placements`, from the cache above when still valid. Do not write to the
// result.
at::Tensor redistributed_local(const at::Tensor& dtensor, const Placements& placements);
// Registers the dispatcher handler once (tensor/dispatch.cpp).
void ensure_dispatch_registered();
// Test-only: how many op calls so far fell back to gathering their inputs.
int64_t gather_count();

}  // namespace dtrain::tensor::detail
