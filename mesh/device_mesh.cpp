// DeviceMesh; see device_mesh.h.
#include "mesh/device_mesh.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/log.h"
#include "mesh/mesh_math.h"

namespace dtrain::mesh {

namespace {

constexpr int kMaxAxes = 8;  // axes compared one by one; more (never seen) are compared through the hash

std::string shape_text(const int64_t* d) {
  std::string s = "(";
  for (int a = 0; a < std::min<int64_t>(d[0], kMaxAxes); ++a) s += str_cat(a ? ", " : "", d[1 + a]);
  return s + (d[0] > kMaxAxes ? ", ...)" : ")");
}

// Every rank of `group` must build the same mesh: a rank that builds another shape would pair its axis
// groups' collectives with the wrong peers. One all_gather of (axes, dims, hash of the names) per mesh.
void check_same_mesh(comm::Backend& group, const std::vector<int64_t>& shape,
                     const std::vector<std::string>& names) {
  constexpr int kFields = 2 + kMaxAxes;
  at::Tensor mine = at::full({kFields}, -1, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  m[0] = static_cast<int64_t>(shape.size());
  for (size_t a = 0; a < shape.size() && a < kMaxAxes; ++a) m[1 + a] = shape[a];
  uint64_t h = 1469598103934665603ull;
  for (const auto& n : names) {
    for (char c : n + "/") h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  for (int64_t d : shape) h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ull;
  m[kFields - 1] = static_cast<int64_t>(h >> 1);
  at::Tensor all = at::empty({kFields * group.group_size()}, at::kLong);
  group.all_gather(all, mine)->wait();
  const int64_t* a = all.data_ptr<int64_t>();
  for (int g = 1; g < group.group_size(); ++g) {
    if (std::equal(a, a + kFields, a + g * kFields)) continue;
    throw ValueError(
        str_cat(rank_prefix(), " mesh: the ranks build different meshes: rank ", group.global_ranks()[g],
                " builds shape ", shape_text(a + g * kFields), " but rank ", group.global_ranks()[0],
                " builds ", shape_text(a),
                a[g * kFields + kFields - 1] != a[kFields - 1] && shape_text(a) == shape_text(a + g * kFields)
                    ? " (same shape, other axis names)"
                    : "",
                ". Build the same DeviceMesh, with the same axis names, on every rank."));
  }
}

}  // namespace

DeviceMesh::DeviceMesh(comm::BackendPtr group, std::vector<int64_t> shape,
                       std::vector<std::string> axis_names)
    : group_(std::move(group)), shape_(std::move(shape)), names_(std::move(axis_names)) {
  if (!group_) throw ValueError("mesh: the group is null. Pass the backend from dtrain::comm::init().");
  try {
    validate_mesh(shape_, names_, group_->group_size());
  } catch (const ValueError& e) {
    throw ValueError(str_cat(rank_prefix(), " ", e.what()));
  }
  check_same_mesh(*group_, shape_, names_);
  int64_t rank = group_->group_rank();
  coordinate_ = coordinate_of(rank, shape_);
  for (int a = 0; a < ndim(); ++a) {
    if (shape_[a] == size()) {
      axis_groups_.push_back(group_);  // the axis spans the whole group: no new communicator needed
    } else {
      axis_groups_.push_back(
          group_->split(static_cast<int>(slice_color(rank, shape_, a)), static_cast<int>(coordinate_[a])));
    }
  }
}

DeviceMesh::DeviceMesh(comm::BackendPtr group, std::vector<int64_t> shape, std::vector<std::string> names,
                       std::vector<comm::BackendPtr> axis_groups)
    : group_(std::move(group)),
      shape_(std::move(shape)),
      names_(std::move(names)),
      axis_groups_(std::move(axis_groups)) {
  coordinate_ = coordinate_of(group_->group_rank(), shape_);
}

int64_t DeviceMesh::size() const { return mesh_size(shape_); }

int DeviceMesh::axis(const std::string& name) const {
  for (int a = 0; a < ndim(); ++a) {
    if (names_[a] == name) return a;
  }
  std::string known;
  for (int a = 0; a < ndim(); ++a) known += str_cat(a ? ", " : "", "\"", names_[a], "\"");
  throw ValueError(str_cat(rank_prefix(), " mesh: no axis named \"", name, "\"; this mesh has ", known,
                           ". Use one of those names."));
}

DeviceMesh DeviceMesh::sub_mesh(const std::string& name) const {
  int a = axis(name);
  return DeviceMesh(axis_groups_[a], {shape_[a]}, {names_[a]}, {axis_groups_[a]});
}

std::string DeviceMesh::to_string() const {
  std::string s = "DeviceMesh(shape=(", axes, coord;
  for (int a = 0; a < ndim(); ++a) {
    s += str_cat(a ? ", " : "", shape_[a]);
    axes += str_cat(a ? ", " : "", names_[a]);
    coord += str_cat(a ? ", " : "", coordinate_[a]);
  }
  std::string ranks;
  for (size_t i = 0; i < global_ranks().size(); ++i) ranks += str_cat(i ? ", " : "", global_ranks()[i]);
  return str_cat(s, "), axes=(", axes, "), ranks=(", ranks, "), coordinate=(", coord, "))");
}

}  // namespace dtrain::mesh
