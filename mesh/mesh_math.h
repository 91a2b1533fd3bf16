// Pure arithmetic of an N-d device mesh laid out row-major over ranks: coordinates, ranks, axis slices. No
// communication, so every function is tested by looping over ranks in one process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::mesh {

// Checks a mesh description; ValueError with the values and the fix when: shape is empty or has a dim < 1,
// names and shape differ in length, a name is empty or repeated, or the product of shape is not `world_size`.
void validate_mesh(const std::vector<int64_t>& shape, const std::vector<std::string>& names, int world_size);

int64_t mesh_size(const std::vector<int64_t>& shape);
// Coordinate of `rank` (row-major: the last axis varies fastest).
std::vector<int64_t> coordinate_of(int64_t rank, const std::vector<int64_t>& shape);
int64_t rank_of(const std::vector<int64_t>& coordinate, const std::vector<int64_t>& shape);
// The ranks that share every coordinate of `rank` except along `axis`, ordered by their coordinate on `axis`.
std::vector<int64_t> axis_slice(int64_t rank, const std::vector<int64_t>& shape, int axis);
// A number that is the same for exactly the ranks of one axis slice (the row-major index of the coordinate
// with `axis` removed): the color for Backend::split.
int64_t slice_color(int64_t rank, const std::vector<int64_t>& shape, int axis);

}  // namespace dtrain::mesh
