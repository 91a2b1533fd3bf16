// DeviceMesh; see device_mesh.h.
#include "mesh/device_mesh.h"

#include "core/error.h"
#include "core/log.h"
#include "mesh/mesh_math.h"

namespace dtrain::mesh {

DeviceMesh::DeviceMesh(comm::BackendPtr group, std::vector<int64_t> shape,
                       std::vector<std::string> axis_names)
    : group_(std::move(group)), shape_(std::move(shape)), names_(std::move(axis_names)) {
  if (!group_) throw ValueError("mesh: the group is null. Pass the backend from dtrain::comm::init().");
  try {
    validate_mesh(shape_, names_, group_->group_size());
  } catch (const ValueError& e) {
    throw ValueError(str_cat(rank_prefix(), " ", e.what()));
  }
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
