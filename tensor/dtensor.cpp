// DTensor creation and access; see dtensor.h.
#include "tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
#include <mutex>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/redistribute.h"
#include "tensor/settings.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor {

namespace {

// Constructs the storage-less impl; only the constructor needs the subclass (see dtensor.h). Its sizes and
// strides are the global tensor's, as libtorch would lay it out on one process: functions of global metadata
// only, never of this rank's block, so that every decision libtorch takes from them (is it contiguous, can it
// be viewed) is the same on every rank.
struct DTensorImpl : c10::TensorImpl {
  DTensorImpl(const at::Tensor& local, c10::IntArrayRef global_shape, c10::IntArrayRef global_strides,
              int64_t global_offset)
      : c10::TensorImpl(c10::DispatchKeySet(detail::kDTensorKey), local.dtype(), local.device()) {
    set_storage_access_should_throw();
    set_sizes_and_strides(global_shape, global_strides, global_offset);
  }
};

// The planner's cache for meshes of `axes` axes, with the cost model of the profile the settings name
// (DTRAIN_COMM_PROFILE, written by `dtrain bench comm --profile FILE` on this machine), or the built-in
// defaults while none is named. One cache per (axes, profile), so changed settings take effect.
PlanCache& plan_cache(int axes) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, std::unique_ptr<PlanCache>> caches;
  thread_local uint64_t seen = ~uint64_t{0};  // the settings' generation `profile` was read at
  thread_local std::string profile;
  if (uint64_t g = settings_generation(); g != seen) {
    profile = settings().comm_profile;
    seen = g;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto& c = caches[{axes, profile}];
  if (!c) {
    static bool told = false;  // (under mu)
    if (profile.empty() && !told) {
      told = true;
      log_info(
          "DTensor plans its redistributions on built-in costs (loopback TCP figures, DESIGN §8), not "
          "this machine's: set DTRAIN_COMM_PROFILE to a profile written by `dtrain bench comm --profile "
          "FILE` to plan on measured ones.");
    }
    c = std::make_unique<PlanCache>(profile.empty()
                                        ? CostModel::defaults(axes)
                                        : CostModel::from_profile(comm::read_profile(profile), axes));
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

std::vector<int64_t> dense_strides(c10::IntArrayRef sizes, c10::IntArrayRef order_by) {
  const size_t n = sizes.size();
  std::vector<size_t> order(n);  // outermost first
  std::iota(order.begin(), order.end(), 0);
  if (order_by.size() == n) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return order_by[a] > order_by[b]; });
  }
  std::vector<int64_t> strides(n, 1);
  int64_t step = 1;
  for (size_t k = n; k-- > 0;) {
    strides[order[k]] = step;
    step *= std::max<int64_t>(sizes[order[k]], 1);
  }
  return strides;
}

at::Tensor conform_layout(const at::Tensor& local, c10::IntArrayRef global_strides) {
  if (local.numel() <= 1 || static_cast<size_t>(local.dim()) != global_strides.size()) return local;
  // The common case without allocating: a contiguous block of a tensor laid out in dim order.
  if (std::is_sorted(global_strides.rbegin(), global_strides.rend()) && local.is_contiguous()) return local;
  std::vector<int64_t> want = dense_strides(local.sizes(), global_strides);
  bool same = true;
  for (int64_t d = 0; d < local.dim() && same; ++d) same = local.size(d) <= 1 || local.stride(d) == want[d];
  if (same) return local;
  return at::empty_strided(local.sizes(), want, local.options()).copy_(local);
}

at::Tensor make_dtensor(at::Tensor local, MeshPtr mesh, Placements placements,
                        std::vector<int64_t> global_shape, c10::IntArrayRef global_strides,
                        int64_t global_offset) {
  ensure_dispatch_registered();
  std::vector<int64_t> contiguous;
  if (global_strides.size() != global_shape.size())
    global_strides = contiguous = dense_strides(global_shape, {});
  at::Tensor t = at::detail::make_tensor<DTensorImpl>(local, global_shape, global_strides, global_offset);
  t.unsafeGetTensorImpl()->set_backend_meta(
      c10::make_intrusive<DTensorMeta>(std::move(local), std::move(mesh), std::move(placements)));
  return t;
}

uint64_t next_call_seq() {
  static std::atomic<uint64_t> seq{0};
  return ++seq;
}

void report_failure(const MeshPtr& mesh, uint64_t call_seq, const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  mesh->group()->report_failure(str_cat("DTensor call ", call_seq),
                                c10e != nullptr ? c10e->what_without_backtrace() : e.what());
}

}  // namespace detail

bool is_dtensor(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->key_set().has(detail::kDTensorKey) &&
         dynamic_cast<const detail::DTensorMeta*>(t.unsafeGetTensorImpl()->get_backend_meta()) != nullptr;
}

at::Tensor detail::to_local_raw(const at::Tensor& t) { return meta(t, "to_local").local; }
at::Tensor stored_block(const at::Tensor& t) { return meta(t, "stored_block").local; }
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

namespace {

// distribute_tensor on a mesh already checked.
at::Tensor distribute_on(const at::Tensor& full, MeshPtr mesh, Placements placements, int src_rank) {
  placements = check_placements("distribute_tensor", placements, full.dim(), mesh->ndim());
  at::Tensor t = full.contiguous().clone();
  mesh->group()->broadcast(t, {src_rank})->wait();
  at::Tensor block = local_block(t, mesh->shape(), placements, mesh->coordinate());
  return detail::make_dtensor(block, std::move(mesh), std::move(placements), full.sizes().vec());
}
}  // namespace

at::Tensor distribute_tensor(const at::Tensor& full, MeshPtr mesh, Placements placements, int src_rank) {
  if (!mesh)
    throw ValueError("distribute_tensor: the mesh is null. Pass a std::shared_ptr<const DeviceMesh>.");
  return detail::reporting_failures(mesh, [&] { return distribute_on(full, mesh, placements, src_rank); });
}

PlanPtr redistribute_plan(const at::Tensor& t, const Placements& placements) {
  const auto& m = meta(t, "redistribute");
  Placements to = check_placements("redistribute", placements, t.dim(), m.mesh->ndim());
  return plan_cache(m.mesh->ndim())
      .get({t.sizes().vec(), static_cast<int64_t>(t.element_size()), m.mesh->shape(), m.placements, to});
}

at::Tensor detail::redistribute_raw(const at::Tensor& t, const Placements& placements) {
  const auto& m = meta(t, "redistribute");
  const PlanPtr held = redistribute_plan(t, placements);
  const RedistributePlan& plan = *held;
  at::Tensor local = run_redistribute(m.local, *m.mesh, plan);
  // The values keep their global layout; a block the collectives made afresh follows it.
  if (!plan.steps.empty()) local = conform_layout(local, t.strides());
  return detail::make_dtensor(local, m.mesh, plan.problem.to, t.sizes().vec(), t.strides());
}

namespace {

// The process-wide cache of redistributed copies (policy: detail::redistributed_local), least recently used
// last.
struct CopyCache {
  struct Entry {
    const detail::DTensorMeta* owner;
    Placements placements;
    uint32_t version, local_version;
    at::Tensor local;
    int64_t bytes;
  };
  std::mutex mu;
  std::atomic<size_t> size{0};  // entries.size(), read without the lock by ~DTensorMeta
  std::list<Entry> entries;     // guarded by mu
  std::map<std::pair<const detail::DTensorMeta*, Placements>, std::list<Entry>::iterator> index;  // guarded
  int64_t bytes = 0;  // guarded by mu

  void erase(std::list<Entry>::iterator it) {
    bytes -= it->bytes;
    index.erase({it->owner, it->placements});
    entries.erase(it);
    size = entries.size();
  }
};

CopyCache& copy_cache() {
  static auto* c = new CopyCache;  // never destroyed: DTensors may die after static destruction starts
  return *c;
}

thread_local bool t_no_cache = false;

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

}  // namespace

detail::DTensorMeta::~DTensorMeta() {
  CopyCache& c = copy_cache();
  if (c.size.load(std::memory_order_relaxed) == 0) return;  // most DTensors die with nothing cached
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto it = c.index.lower_bound({this, Placements{}}); it != c.index.end() && it->first.first == this;) {
    auto entry = it->second;
    ++it;
    c.erase(entry);
  }
}

at::Tensor detail::redistributed_local(const at::Tensor& t, const Placements& placements) {
  const auto& m = meta(t, "redistribute");
  const int64_t budget = cache_bytes();
  if (t_no_cache || budget <= 0 || t.is_inference() || m.local.is_inference()) {
    return to_local_raw(redistribute_raw(t, placements));
  }
  uint32_t v = t.unsafeGetTensorImpl()->version_counter().current_version();
  uint32_t lv = m.local.unsafeGetTensorImpl()->version_counter().current_version();
  CopyCache& c = copy_cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.index.find({&m, placements});
    if (it != c.index.end()) {
      if (it->second->version == v && it->second->local_version == lv) {
        c.entries.splice(c.entries.begin(), c.entries, it->second);
        return it->second->local;
      }
      c.erase(it->second);  // stale: the tensor changed since
    }
  }
  at::Tensor local = to_local_raw(redistribute_raw(t, placements));
  const int64_t bytes = bytes_of(local);
  if (bytes > budget) return local;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.index.count({&m, placements})) return local;  // another thread kept one meanwhile
  while (!c.entries.empty() && c.bytes + bytes > budget) c.erase(std::prev(c.entries.end()));
  c.entries.push_front({&m, placements, v, lv, local, bytes});
  c.index[{&m, placements}] = c.entries.begin();
  c.bytes += bytes;
  c.size = c.entries.size();
  return local;
}

int64_t redistribute_cache_bytes() {
  CopyCache& c = copy_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.bytes;
}

void clear_redistribute_cache() {
  CopyCache& c = copy_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries.clear();
  c.index.clear();
  c.bytes = 0;
  c.size = 0;
}

NoRedistributeCache::NoRedistributeCache() : previous_(t_no_cache) { t_no_cache = true; }
NoRedistributeCache::~NoRedistributeCache() { t_no_cache = previous_; }

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
