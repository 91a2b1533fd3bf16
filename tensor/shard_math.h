// Pure shard arithmetic (DESIGN §4, "Uneven shards are exact"): Shard(dim) splits n rows over k ranks
// balanced, rank r holding n/k + (r < n%k) rows; several mesh axes sharding one dim nest in axis order (the
// first axis splits the dim, the next splits each of those parts, ...). Functions of sizes and indices only,
// tested by looping over ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/placement.h"

namespace dtrain::tensor {

// Rows that part r of k holds of a dim of n rows (core/balanced_split.h).
int64_t shard_size(int64_t n, int64_t k, int64_t r);
// Index of the first of those rows.
int64_t shard_offset(int64_t n, int64_t k, int64_t r);

// The block of the global tensor held at one mesh coordinate: its shape and its offset in every dim.
struct LocalChunk {
  std::vector<int64_t> shape;
  std::vector<int64_t> offset;
};

// Requires valid placements (see check_placements). Partial and Replicate axes do not split.
LocalChunk local_chunk(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
                       const Placements& placements, const std::vector<int64_t>& coordinate);

// The largest local size of every dim over all coordinates (each nested split rounds up).
std::vector<int64_t> max_local_shape(const std::vector<int64_t>& shape,
                                     const std::vector<int64_t>& mesh_shape, const Placements& placements);

// Validates placements for a tensor of `ndim` dims on a mesh of `mesh_ndim` axes: one per axis, Shard dims in
// range (a negative dim counts from the end and is normalised in the returned copy). ValueError naming `who`,
// the value and the fix otherwise; NotSupportedError for Partial kinds that have no meaning together (see
// mixed_partials).
Placements check_placements(const char* who, const Placements& placements, int64_t ndim, int64_t mesh_ndim);

// Partial on several mesh axes (docs/architecture.md, "Partial on several axes"). The value is the reduction
// over every axis's parts, and it must not depend on which axis reduces first. That holds for Partial(sum)
// and Partial(avg) in any mix (both linear: the sum of all parts divided by the sizes of the avg axes), for
// Partial(max) on several axes, and for Partial(min) on several axes. Any other mix (max with min, or sum/avg
// with max/min) reduces differently in each order: this says which mix it is ("" when there is none).
std::string mixed_partials(const Placements& placements);

// One past the largest storage position of a tensor with these sizes, strides and storage offset (the
// offset itself when it has no element): the storage a view of that geometry needs.
int64_t storage_extent(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                       int64_t offset);

}  // namespace dtrain::tensor
