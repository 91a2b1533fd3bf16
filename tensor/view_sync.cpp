// Views of DTensors kept in step with what they view; see detail/view_sync.h.
//
// Positions: the root and its views share one global geometry, as on one process. An element at index i of
// a tensor with sizes s, strides st and offset o sits at position o + sum_d i_d * st_d of a virtual storage.
// A write-back gathers the view's values (a view-sized redistribution to Replicate), finds for each element
// of this rank's root block whether the view covers its position (a sorted search, no root-sized buffer) and
// overwrites those elements. A refresh gathers the root and reads the view's block out of it.
#include "tensor/detail/view_sync.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor::detail {

namespace {

DTensorMeta& meta_of(const at::Tensor& t) {
  return *static_cast<DTensorMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

// Positions of the elements of the block [offset, offset + shape) of a tensor with global `strides` and
// storage offset `base`, flattened in the block's row-major order.
at::Tensor positions(c10::IntArrayRef shape, const std::vector<int64_t>& offset, c10::IntArrayRef strides,
                     int64_t base) {
  at::Tensor pos = at::full(shape, base, at::kLong);
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    std::vector<int64_t> along(shape.size(), 1);
    along[d] = shape[d];
    pos = pos + ((at::arange(shape[d], at::kLong) + offset[d]) * strides[d]).view(along);
  }
  return pos.reshape({-1});
}

// One past the largest position of a tensor's elements.
int64_t extent(const at::Tensor& t) {
  return storage_extent(t.sizes().vec(), t.strides().vec(), t.storage_offset());
}

bool zero_part(const DTensorMeta& m) {
  for (size_t a = 0; a < m.placements.size(); ++a) {
    if (m.placements[a].is_partial() && m.placements[a].op == ReduceOp::kSum && m.mesh->coordinate()[a] != 0)
      return true;
  }
  return false;
}

// Scatters the values of `view` into `root`'s blocks at the positions the view covers.
void write_back(const at::Tensor& view, const at::Tensor& root) {
  DTensorMeta& rm = meta_of(root);
  const int axes = rm.mesh->ndim();
  const at::Tensor values = to_local_raw(redistribute_raw(view, Placements(axes, Replicate()))).reshape({-1});
  at::Tensor vpos =
      positions(view.sizes(), std::vector<int64_t>(view.dim(), 0), view.strides(), view.storage_offset());
  const int64_t n = vpos.numel();
  if (n == 0) return;
  auto [sorted, order] = vpos.sort();
  LocalChunk chunk = local_chunk(root.sizes().vec(), rm.mesh->shape(), rm.placements, rm.mesh->coordinate());
  at::Tensor bpos = positions(chunk.shape, chunk.offset, root.strides(), root.storage_offset());
  if (bpos.numel() == 0) return;
  at::Tensor at_pos = at::searchsorted(sorted, bpos).clamp_max(n - 1);
  at::Tensor found = sorted.index_select(0, at_pos).eq(bpos);
  at::Tensor picked = values.index_select(0, order.index_select(0, at_pos.masked_select(found)));
  if (zero_part(rm)) picked = at::zeros_like(picked);  // a Partial(sum) part other than the first holds 0
  rm.local.masked_scatter_(found.view(chunk.shape), picked.to(rm.local.scalar_type()));
  if (!rm.local.is_inference()) rm.local.unsafeGetTensorImpl()->bump_version();  // redistributed copies
}

// The view's block from the root's current values.
void refresh(const at::Tensor& view, const at::Tensor& root) {
  DTensorMeta& vm = meta_of(view);
  const int axes = vm.mesh->ndim();
  at::Tensor full = to_local_raw(redistribute_raw(root, Placements(axes, Replicate())));
  at::Tensor storage = at::empty({std::max(extent(root), extent(view))}, full.options());
  storage.as_strided(root.sizes(), root.strides(), root.storage_offset()).copy_(full);
  at::Tensor whole = storage.as_strided(view.sizes(), view.strides(), view.storage_offset());
  vm.local.copy_(local_block(whole, vm.mesh->shape(), vm.placements, vm.mesh->coordinate()));
  if (!vm.local.is_inference()) vm.local.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

void mark_view(const at::Tensor& out, const at::Tensor& in, bool aliases) {
  const DTensorMeta& im = meta_of(in);
  auto v = std::make_shared<ViewOf>();
  v->root = im.view ? im.view->root : in;
  v->aliases = aliases && (!im.view || im.view->aliases);
  v->synced_writes = meta_of(v->root).writes.load();
  meta_of(out).view = std::move(v);
}

void sync_view(const at::Tensor& t) {
  DTensorMeta& m = meta_of(t);
  if (!m.view || m.view->aliases) return;
  const uint64_t writes = meta_of(m.view->root).writes.load();
  if (m.view->synced_writes == writes) return;
  refresh(t, m.view->root);
  m.view->synced_writes = writes;
}

void after_write(const at::Tensor& t) {
  DTensorMeta& m = meta_of(t);
  if (!m.view) {
    ++m.writes;
    return;
  }
  const at::Tensor& root = m.view->root;
  if (!m.view->aliases) write_back(t, root);
  m.view->synced_writes = ++meta_of(root).writes;
}

}  // namespace dtrain::tensor::detail
