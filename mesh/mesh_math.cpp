// Mesh arithmetic; see mesh_math.h.
#include "mesh/mesh_math.h"

#include <set>

#include "core/error.h"

namespace dtrain::mesh {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += str_cat(i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

int64_t mesh_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void validate_mesh(const std::vector<int64_t>& shape, const std::vector<std::string>& names, int world_size) {
  if (shape.empty()) {
    throw ValueError(str_cat("mesh: the shape is empty. Give at least one axis, e.g. shape (", world_size,
                             ",) with names (\"dp\",)."));
  }
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] < 1) {
      throw ValueError(str_cat("mesh: axis ", a, " of shape ", shape_str(shape), " has size ", shape[a],
                               "; every axis needs at least 1 rank."));
    }
  }
  if (names.size() != shape.size()) {
    throw ValueError(str_cat("mesh: shape ", shape_str(shape), " has ", shape.size(), " axes but ",
                             names.size(), " names were given. Give one name per axis."));
  }
  std::set<std::string> seen;
  for (const auto& n : names) {
    if (n.empty()) throw ValueError("mesh: an axis name is empty. Name every axis, e.g. \"dp\", \"tp\".");
    if (!seen.insert(n).second) {
      throw ValueError(str_cat("mesh: axis name \"", n, "\" is used twice. Give each axis its own name."));
    }
  }
  if (mesh_size(shape) != world_size) {
    std::string product;
    for (size_t a = 0; a < shape.size(); ++a)
      product += str_cat(a ? " * " : "", names[a], "(", shape[a], ")");
    throw ValueError(str_cat("mesh: shape ", shape_str(shape), " needs ", mesh_size(shape),
                             " ranks but WORLD_SIZE is ", world_size, ": ", product, " = ", mesh_size(shape),
                             " != world_size(", world_size, "). Use a mesh shape whose product is ",
                             world_size, "."));
  }
}

std::vector<int64_t> coordinate_of(int64_t rank, const std::vector<int64_t>& shape) {
  DTRAIN_ASSERT(rank >= 0 && rank < mesh_size(shape), "rank ", rank, " outside mesh of ", mesh_size(shape));
  std::vector<int64_t> c(shape.size());
  for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
    c[a] = rank % shape[a];
    rank /= shape[a];
  }
  return c;
}

int64_t rank_of(const std::vector<int64_t>& coordinate, const std::vector<int64_t>& shape) {
  DTRAIN_ASSERT(coordinate.size() == shape.size(), "coordinate has ", coordinate.size(), " axes, mesh ",
                shape.size());
  int64_t r = 0;
  for (size_t a = 0; a < shape.size(); ++a) {
    DTRAIN_ASSERT(coordinate[a] >= 0 && coordinate[a] < shape[a], "coordinate ", coordinate[a], " on axis ",
                  a);
    r = r * shape[a] + coordinate[a];
  }
  return r;
}

std::vector<int64_t> axis_slice(int64_t rank, const std::vector<int64_t>& shape, int axis) {
  DTRAIN_ASSERT(axis >= 0 && axis < static_cast<int>(shape.size()), "axis ", axis);
  auto c = coordinate_of(rank, shape);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < shape[axis]; ++i) {
    c[axis] = i;
    out.push_back(rank_of(c, shape));
  }
  return out;
}

int64_t slice_color(int64_t rank, const std::vector<int64_t>& shape, int axis) {
  auto c = coordinate_of(rank, shape);
  int64_t color = 0;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (static_cast<int>(a) != axis) color = color * shape[a] + c[a];
  }
  return color;
}

}  // namespace dtrain::mesh
