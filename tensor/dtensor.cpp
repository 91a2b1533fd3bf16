// DTensor creation and access; see dtensor.h.
#include "tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor {

namespace {

// Constructs the storage-less impl; only the constructor needs the subclass (see dtensor.h).
struct DTensorImpl : c10::TensorImpl {
  DTensorImpl(const at::Tensor& local, const std::vector<int64_t>& global_shape)
      : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), local.dtype(), local.device()) {
    set_storage_access_should_throw();
    // Strides: the block's own where the block is the whole tensor (Replicate and Partial), so that libtorch
    // sees exactly the layout it would see on a plain tensor (what contiguous() copies, which views are
    // legal); otherwise dense for the global shape with the dims in the order of the block's strides, so a
    // transposed block (a weight's gradient from t()) reports transposed strides and autograd stores
    // gradients in the parameter's layout.
    const size_t n = global_shape.size();
    if (local.sizes() == c10::IntArrayRef(global_shape)) {
      set_sizes_and_strides(global_shape, local.strides());
      return;
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    if (static_cast<size_t>(local.dim()) == n) {
      auto ls = local.strides();
      auto lz = local.sizes();
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        // size-1 dims carry no layout: they keep their place
        if (lz[a] <= 1 || lz[b] <= 1) return false;
        return ls[a] > ls[b];
      });
    }
    std::vector<int64_t> strides(n, 1);
    int64_t step = 1;
    for (size_t k = n; k-- > 0;) {
      strides[order[k]] = step;
      step *= std::max<int64_t>(global_shape[order[k]], 1);
    }
    set_sizes_and_strides(global_shape, strides);
  }
};

// The planner's cache for meshes of `axes` axes, with the cost model of the profile named by
// DTRAIN_COMM_PROFILE (written by `dtrain bench comm --profile FILE` on this machine), or the built-in
// defaults while none is named. One cache per (axes, profile), so a changed variable takes effect.
PlanCache& plan_cache(int axes) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, std::unique_ptr<PlanCache>> caches;
  const char* env = std::getenv("DTRAIN_COMM_PROFILE");
  std::string profile = env != nullptr ? env : "";
  std::lock_guard<std::mutex> lock(mu);
  auto& c = caches[{axes, profile}];
  if (!c) {
    c = std::make_unique<PlanCache>(profile.empty() ? CostModel::defaults(axes)
                                                    : CostModel::from_profile(read_profile(profile), axes));
  }
  return *c;
}

const detail::DTensorMeta& meta(const at::Tensor& t, const char* who) {
  if (!is_dtensor(t)) {
    throw ValueError(str_cat(who, ": the tensor is not a DTensor (", t.defined() ? t.toString() : "undefined",
                             "). Make one with distribute_tensor() or from_local()."));
  }
  return *static_cast<const detail::DTensorMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

}  // namespace

namespace detail {

at::Tensor make_dtensor(at::Tensor local, MeshPtr mesh, Placements placements,
                        std::vector<int64_t> global_shape) {
  ensure_dispatch_registered();
  at::Tensor t = at::detail::make_tensor<DTensorImpl>(local, global_shape);
  t.unsafeGetTensorImpl()->set_backend_meta(
      c10::make_intrusive<DTensorMeta>(std::move(local), std::move(mesh), std::move(placements)));
  return t;
}

}  // namespace detail

bool is_dtensor(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::PrivateUse1) &&
         dynamic_cast<const detail::DTensorMeta*>(t.unsafeGetTensorImpl()->get_backend_meta()) != nullptr;
}

at::Tensor detail::to_local_raw(const at::Tensor& t) { return meta(t, "to_local").local; }
const MeshPtr& mesh_of(const at::Tensor& t) { return meta(t, "mesh_of").mesh; }
const Placements& placements_of(const at::Tensor& t) { return meta(t, "placements_of").placements; }

at::Tensor detail::from_local_raw(const at::Tensor& local, MeshPtr mesh, Placements placements,
                                  std::optional<std::vector<int64_t>> global_shape) {
  if (!mesh) throw ValueError("from_local: the mesh is null. Pass a std::shared_ptr<const DeviceMesh>.");
  placements = check_placements("from_local", placements, local.dim(), mesh->ndim());
  std::vector<int64_t> shape;
  if (global_shape) {
    shape = *global_shape;
  } else {
    // Innermost sharding axis first: summing a dim's blocks over an axis gives the block of the next axis
    // out.
    shape = local.sizes().vec();
    for (int a = mesh->ndim() - 1; a >= 0; --a) {
      if (!placements[a].is_shard()) continue;
      at::Tensor n = at::full({1}, shape[placements[a].dim], at::kLong);
      mesh->axis_group(a)->all_reduce(n)->wait();
      shape[placements[a].dim] = n.item<int64_t>();
    }
  }
  auto expect = local_chunk(shape, mesh->shape(), placements, mesh->coordinate()).shape;
  if (local.sizes().vec() != expect) {
    throw ValueError(str_cat(rank_prefix(), " from_local: this rank's block has shape ", local.sizes(),
                             " but ", to_string(placements), " of a tensor of shape ",
                             c10::IntArrayRef(shape), " gives it ", c10::IntArrayRef(expect),
                             ". Pass the matching global_shape or block."));
  }
  return detail::make_dtensor(local, std::move(mesh), std::move(placements), std::move(shape));
}

at::Tensor distribute_tensor(const at::Tensor& full, MeshPtr mesh, Placements placements, int src_rank) {
  if (!mesh)
    throw ValueError("distribute_tensor: the mesh is null. Pass a std::shared_ptr<const DeviceMesh>.");
  placements = check_placements("distribute_tensor", placements, full.dim(), mesh->ndim());
  at::Tensor t = full.contiguous().clone();
  mesh->group()->broadcast(t, {src_rank})->wait();
  at::Tensor block = local_block(t, mesh->shape(), placements, mesh->coordinate());
  return detail::make_dtensor(block, std::move(mesh), std::move(placements), full.sizes().vec());
}

const RedistributePlan& redistribute_plan(const at::Tensor& t, const Placements& placements) {
  const auto& m = meta(t, "redistribute");
  Placements to = check_placements("redistribute", placements, t.dim(), m.mesh->ndim());
  return plan_cache(m.mesh->ndim())
      .get({t.sizes().vec(), static_cast<int64_t>(t.element_size()), m.mesh->shape(), m.placements, to});
}

at::Tensor detail::redistribute_raw(const at::Tensor& t, const Placements& placements) {
  const auto& m = meta(t, "redistribute");
  const RedistributePlan& plan = redistribute_plan(t, placements);
  at::Tensor local = run_redistribute(m.local, *m.mesh, plan);
  return detail::make_dtensor(local, m.mesh, plan.problem.to, t.sizes().vec());
}

at::Tensor detail::redistributed_local(const at::Tensor& t, const Placements& placements) {
  const auto& m = meta(t, "redistribute");
  if (t.is_inference() || m.local.is_inference()) return to_local_raw(redistribute_raw(t, placements));
  uint32_t v = t.unsafeGetTensorImpl()->version_counter().current_version();
  uint32_t lv = m.local.unsafeGetTensorImpl()->version_counter().current_version();
  auto it = m.redistributed.find(placements);
  if (it != m.redistributed.end() && it->second.version == v && it->second.local_version == lv) {
    return it->second.local;
  }
  at::Tensor local = to_local_raw(redistribute_raw(t, placements));
  m.redistributed[placements] = {v, lv, local};
  return local;
}

LocalChunk DTensorSpec::local_chunk() const {
  return tensor::local_chunk(shape, mesh->shape(), placements, mesh->coordinate());
}

std::string DTensorSpec::to_string() const {
  return str_cat("DTensorSpec(shape=", c10::IntArrayRef(shape), ", ", dtype, ", ",
                 tensor::to_string(placements), " on ", mesh->to_string(), ")");
}

DTensorSpec spec_of(const at::Tensor& t) {
  const auto& m = meta(t, "spec_of");
  return DTensorSpec{m.mesh, m.placements, t.sizes().vec(), t.scalar_type()};
}

at::Tensor full_tensor(const at::Tensor& t) {
  const auto& m = meta(t, "full_tensor");
  return to_local(
      redistribute(t, Placements(m.mesh->ndim(), Replicate())));  // differentiable, like its parts
}

}  // namespace dtrain::tensor
