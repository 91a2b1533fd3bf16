// Running a redistribution plan on this rank's local shard: each step's collective on the mesh axis's group,
// with exact variable-size collectives for uneven shards (no padding reaches the caller), or the local slice
// or scale.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mesh/device_mesh.h"
#include "tensor/redistribute_plan.h"

namespace dtrain::tensor {

// One collective the executor issued, for accounting and for tests that compare it with the plan.
struct IssuedCollective {
  StepKind kind;
  int axis;
  int64_t bytes;  // bytes this rank contributed
};

// `local` is this rank's block of a tensor laid out as plan.problem.from on `mesh` (whose shape must equal
// plan.problem.mesh_shape); returns its block under plan.problem.to. Collective over the mesh: every rank
// runs the same plan. `issued`, when given, receives the collectives in order.
at::Tensor run_redistribute(const at::Tensor& local, const mesh::DeviceMesh& mesh,
                            const RedistributePlan& plan, std::vector<IssuedCollective>* issued = nullptr);

// This rank's block of `full` (the whole tensor, present on every rank) for `placements`: shards are sliced;
// for a Partial(sum) axis the coordinate-0 rank keeps the values and the others hold zeros; avg, max and min
// keep them.
at::Tensor local_block(const at::Tensor& full, const std::vector<int64_t>& mesh_shape,
                       const Placements& placements, const std::vector<int64_t>& coordinate);

}  // namespace dtrain::tensor
