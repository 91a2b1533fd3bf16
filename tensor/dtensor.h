// DTensor: an ordinary at::Tensor whose implementation carries this rank's local block, the device mesh and
// one placement per mesh axis; its sizes are the global shape (DESIGN §4). libtorch ops on it reach dtrain's
// dispatcher handler (tensor/dispatch.cpp), which runs them on the local blocks when the placements allow it
// and otherwise gathers to Replicate (warning once per op; DTRAIN_DTENSOR_STRICT=1 makes that an error).
//
// Representation: a storage-less TensorImpl on DTensor's dispatch key (PrivateUse1, or what the build option
// DTRAIN_DISPATCH_KEY names; its reported device is the local
// block's), with the local block, mesh and placements in a c10::BackendMeta. Keeping them in BackendMeta
// rather than in a TensorImpl subclass means set_data() and shallow_copy_from() (which copy metadata into an
// existing impl, e.g. a module's parameter) carry the DTensor over intact.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "tensor/placement.h"
#include "tensor/redistribute_plan.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor {

using MeshPtr = std::shared_ptr<const mesh::DeviceMesh>;

bool is_dtensor(const at::Tensor& t);

// What a DTensor is apart from its values: the mesh, one placement per mesh axis, the global shape and the
// dtype.
struct DTensorSpec {
  MeshPtr mesh;
  Placements placements;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  // This rank's block of the global tensor: its shape and offset (Partial and Replicate axes do not split).
  LocalChunk local_chunk() const;
  // "DTensorSpec(shape=(7, 5), Float, (S(0), R) on DeviceMesh(...))"
  std::string to_string() const;
};

// The spec of a DTensor (ValueError for a plain tensor).
DTensorSpec spec_of(const at::Tensor& dtensor);

// Wraps this rank's block. Without `global_shape` the shape is found from the blocks of all ranks (one small
// all_gather per sharding axis), so uneven shards are exact. Collective when global_shape is not given.
at::Tensor from_local(const at::Tensor& local, MeshPtr mesh, Placements placements,
                      std::optional<std::vector<int64_t>> global_shape = std::nullopt);
// Splits `full` (significant on mesh group rank `src_rank`, broadcast to the others) into blocks. Collective.
at::Tensor distribute_tensor(const at::Tensor& full, MeshPtr mesh, Placements placements, int src_rank = 0);

// This rank's block (shares memory with the DTensor).
at::Tensor to_local(const at::Tensor& dtensor);
const MeshPtr& mesh_of(const at::Tensor& dtensor);
const Placements& placements_of(const at::Tensor& dtensor);
// The block as the DTensor stores it (no autograd, no copy): one tensor object for a DTensor and its shallow
// copies (Tensor::data(), set_data), which share its state; plan/step_record.h tells tensors apart by it.
at::Tensor stored_block(const at::Tensor& dtensor);

// A DTensor with the same values laid out as `placements`, by the cheapest plan (cached). Collective.
at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements);
// The whole tensor on every rank, as a plain tensor. Collective.
at::Tensor full_tensor(const at::Tensor& dtensor);
// The redistributed copies DTensor keeps for reuse (see detail::redistributed_local for the policy): their
// bytes, and a way to free them all. Thread-safe.
int64_t redistribute_cache_bytes();
void clear_redistribute_cache();
// While alive, no redistributed copy is kept for reuse on this thread (each use redistributes afresh and the
// copy is freed with its last user).
class NoRedistributeCache {
 public:
  NoRedistributeCache();
  ~NoRedistributeCache();
  NoRedistributeCache(const NoRedistributeCache&) = delete;
  NoRedistributeCache& operator=(const NoRedistributeCache&) = delete;

 private:
  bool previous_;
};

// The plan redistribute() would run, for explain().
PlanPtr redistribute_plan(const at::Tensor& dtensor, const Placements& placements);

}  // namespace dtrain::tensor
