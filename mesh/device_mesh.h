// DeviceMesh: an N-d grid of the ranks of a group, with named axes ("dp", "tp"), one communication sub-group
// per axis slice, this rank's coordinate, and 1-d sub-meshes by axis name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace dtrain::mesh {

// Thread-safety: like its Backend, used by one thread at a time.
class DeviceMesh {
 public:
  // Collective over `group`: lays its ranks out row-major in `shape` and creates one sub-group per axis.
  // ValueError when the shape does not fit the group (see validate_mesh).
  DeviceMesh(comm::BackendPtr group, std::vector<int64_t> shape, std::vector<std::string> axis_names);

  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return names_; }
  int64_t size() const;
  int64_t size(int axis) const { return shape_.at(axis); }
  // Index of an axis by name; ValueError listing the names when it is unknown.
  int axis(const std::string& name) const;
  // This rank's coordinate, one entry per axis.
  const std::vector<int64_t>& coordinate() const { return coordinate_; }
  // The group of the ranks that differ from this one only along `axis`; group rank = coordinate on that axis.
  const comm::BackendPtr& axis_group(int axis) const { return axis_groups_.at(axis); }
  const comm::BackendPtr& axis_group(const std::string& name) const {
    return axis_groups_.at(this->axis(name));
  }
  const comm::BackendPtr& group() const { return group_; }
  // The global rank at each coordinate, row-major.
  const std::vector<int>& global_ranks() const { return group_->global_ranks(); }
  // True when `other` lays out the same global ranks in the same shape, so that its axis groups hold the same
  // ranks as this mesh's: DTensors on the two can be combined. The "dp" and "tp" sub-meshes of a 2x2 mesh
  // have the same shape but not the same ranks.
  bool same_layout(const DeviceMesh& other) const {
    return this == &other || (shape_ == other.shape_ && global_ranks() == other.global_ranks());
  }
  // The 1-d mesh along one axis through this rank.
  DeviceMesh sub_mesh(const std::string& name) const;

  // "DeviceMesh(shape=(2, 2), axes=(dp, tp), ranks=(0, 1, 2, 3), coordinate=(0, 1))"
  std::string to_string() const;

 private:
  DeviceMesh(comm::BackendPtr group, std::vector<int64_t> shape, std::vector<std::string> names,
             std::vector<comm::BackendPtr> axis_groups);

  comm::BackendPtr group_;
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
  std::vector<int64_t> coordinate_;
  std::vector<comm::BackendPtr> axis_groups_;
};

}  // namespace dtrain::mesh
