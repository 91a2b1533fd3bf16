// What a DTensor's TensorImpl carries (in its BackendMeta): the local block, the mesh and the placements.
#pragma once

#include <c10/core/TensorImpl.h>

#include <atomic>
#include <memory>

#include "dispatch/keys.h"
#include "tensor/dtensor.h"

namespace dtrain::tensor::detail {

// The dispatch key DTensors carry: the extension key (dispatch/keys.h), shared with on-demand tensors.
constexpr c10::DispatchKey kDTensorKey = dispatch::kExtensionKey;

// A DTensor made by a view op (narrow, view, select, slice, transpose, as_strided, ...) remembers the DTensor
// it views, so that writes through it reach that tensor and it sees writes made there (tensor/view_sync.h).
// `root` is never itself a view. The view's elements sit where its global sizes, strides and storage offset
// put them in the root's global layout (the root's own sizes, strides and offset): the same geometry
// libtorch gives a view on one process. `synced_writes` is the root's write count (DTensorMeta::writes) when
// this view's block last matched the root; it matters only when the view's block is
// not an alias of the root's (the view's rule had to redistribute). Writes made straight into a block
// (to_local(x).add_(1)) are not counted: a copy made earlier does not see them.
struct ViewOf {
  at::Tensor root;
  bool aliases = true;  // the view's block is a view of the root's block (decided from placements alone)
  uint64_t synced_writes = 0;
};

struct DTensorMeta : c10::BackendMeta {
  DTensorMeta(at::Tensor local, MeshPtr mesh, Placements placements, std::shared_ptr<ViewOf> view = nullptr)
      : local(std::move(local)),
        mesh(std::move(mesh)),
        placements(std::move(placements)),
        view(std::move(view)) {}
  ~DTensorMeta() override;  // drops this tensor's redistributed copies (see redistributed_local)
  // set_data()/detach() copy the metadata: the copy shares the same local block, as a detached tensor shares
  // storage, and views what the original views.
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<DTensorMeta>(local, mesh, placements, view);
  }

  at::Tensor local;
  MeshPtr mesh;
  Placements placements;
  std::shared_ptr<ViewOf> view;  // null: not a view
  // How often the DTensor handler wrote into this tensor or into a view of it (a root's count; see ViewOf).
  mutable std::atomic<uint64_t> writes{0};
};

// Builds a DTensor from parts already checked. `global_strides` are the strides libtorch would give the
// global tensor (computed from global metadata only, the same on every rank); empty: contiguous.
at::Tensor make_dtensor(at::Tensor local, MeshPtr mesh, Placements placements,
                        std::vector<int64_t> global_shape, c10::IntArrayRef global_strides = {},
                        int64_t global_offset = 0);
// Dense strides for `sizes` with the dims ordered as `order_by`'s strides order them (outermost = largest;
// ties keep dim order); `order_by` empty: contiguous.
std::vector<int64_t> dense_strides(c10::IntArrayRef sizes, c10::IntArrayRef order_by);
// `local`, or a dense copy of it laid out in the dim order of `global_strides` when its own layout differs
// (size-1 dims carry no layout), so that a block is viewable wherever its DTensor is.
at::Tensor conform_layout(const at::Tensor& local, c10::IntArrayRef global_strides);
// The non-differentiable cores of to_local, from_local and redistribute (dtensor.cpp); the public functions
// wrap them in autograd functions (dtensor_autograd.cpp).
at::Tensor to_local_raw(const at::Tensor& dtensor);
at::Tensor from_local_raw(const at::Tensor& local, MeshPtr mesh, Placements placements,
                          std::optional<std::vector<int64_t>> global_shape);
at::Tensor redistribute_raw(const at::Tensor& dtensor, const Placements& placements);
// The block of `dtensor` under `placements`, reusing a copy made earlier while it is still valid. Do not
// write to the result. The copies kept for reuse (an optimizer reading a Partial gradient in three ops
// reduces it once; an activation read as Replicate by q, k and v is gathered once) follow one policy:
// - a copy serves only while neither the DTensor nor its block changed (their version counters);
// - at most settings().cache_bytes of copies are kept in the process (DTRAIN_DTENSOR_CACHE_MB, default 64):
//   past that the least recently used go first, and a larger copy is not kept;
// - a DTensor's copies are freed with it, and all of them by clear_redistribute_cache();
// - under a NoRedistributeCache guard nothing is kept (a sharded parameter's gathered copy must be freed
//   right after use).
at::Tensor redistributed_local(const at::Tensor& dtensor, const Placements& placements);
// Runs `f`. An exception escaping it is first posted to every rank of the job (Backend::report_failure,
// tagged with this call's sequence number among DTensor calls), so that ranks waiting in a collective raise
// it within a fraction of a second instead of at their timeout; then it propagates.
uint64_t next_call_seq();
void report_failure(const MeshPtr& mesh, uint64_t call_seq, const std::exception& e);
template <typename F>
decltype(auto) reporting_failures(const MeshPtr& mesh, F&& f) {
  const uint64_t seq = next_call_seq();
  try {
    return f();
  } catch (const std::exception& e) {
    report_failure(mesh, seq, e);
    throw;
  }
}
// Routes the extension key's ops on DTensors to the handler (tensor/dispatch.cpp), registering the router
// once.
void ensure_dispatch_registered();
// Test-only: how many op calls so far fell back to gathering their inputs.
int64_t gather_count();

}  // namespace dtrain::tensor::detail
