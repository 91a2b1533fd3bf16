// Views of DTensors that behave as views (docs/architecture.md, "Views and in-place writes"). A view op's
// rule runs on the blocks; where the input's placements let the op view the block itself, the result's block
// is an alias and writes through it reach the viewed tensor by themselves. Where the rule had to
// redistribute first (narrow, select or view across a sharded dim, as_strided), the result's block is a
// copy. These functions keep such a copy and its root (ViewOf) in step, through the global geometry both
// share: a write through the view is scattered into the root's blocks, and a view read after its root
// changed is refreshed from it. Collective where they move values (every rank takes the same path: it
// depends on placements and write counts only).
#pragma once

#include <ATen/core/Tensor.h>

namespace dtrain::tensor::detail {

// Makes `out`, the result of a view op on DTensor `in`, a view of in's root. `aliases`: out's block is a
// view of in's block (the op ran on it without redistributing).
void mark_view(const at::Tensor& out, const at::Tensor& in, bool aliases);

// Before an op reads or writes DTensor `t`: a view whose block is a copy and whose root was written since
// the copy was made takes the root's current values.
void sync_view(const at::Tensor& t);

// After the DTensor handler wrote into `t`'s block: a view whose block is a copy writes its values into its
// root's blocks; the root's write count goes up (so other copies refresh before their next use).
void after_write(const at::Tensor& t);

}  // namespace dtrain::tensor::detail
