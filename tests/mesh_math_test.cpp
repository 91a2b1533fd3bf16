// Pure tier: mesh arithmetic, checked by looping over every rank of several shapes.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "mesh/mesh_math.h"

using namespace dtrain;
using namespace dtrain::mesh;

namespace {

std::string error_of(const std::vector<int64_t>& shape, const std::vector<std::string>& names, int world) {
  try {
    validate_mesh(shape, names, world);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(MeshMath, CoordinatesRoundTripRowMajor) {
  for (auto shape : std::vector<std::vector<int64_t>>{{1}, {4}, {2, 2}, {2, 3}, {3, 1, 2}, {2, 2, 2}}) {
    int64_t n = mesh_size(shape);
    for (int64_t r = 0; r < n; ++r) {
      auto c = coordinate_of(r, shape);
      EXPECT_EQ(rank_of(c, shape), r);
      // the last axis varies fastest
      if (r + 1 < n && c.back() + 1 < shape.back())
        EXPECT_EQ(coordinate_of(r + 1, shape).back(), c.back() + 1);
    }
  }
  EXPECT_EQ(coordinate_of(5, {2, 3}), (std::vector<int64_t>{1, 2}));
}

TEST(MeshMath, AxisSlicesPartitionTheRanks) {
  for (auto shape : std::vector<std::vector<int64_t>>{{4}, {2, 2}, {2, 3}, {3, 1, 2}}) {
    int64_t n = mesh_size(shape);
    for (int axis = 0; axis < static_cast<int>(shape.size()); ++axis) {
      std::set<int64_t> colors;
      for (int64_t r = 0; r < n; ++r) {
        auto slice = axis_slice(r, shape, axis);
        ASSERT_EQ(static_cast<int64_t>(slice.size()), shape[axis]);
        EXPECT_EQ(slice[coordinate_of(r, shape)[axis]], r);  // this rank sits at its own coordinate
        for (int64_t s : slice) EXPECT_EQ(slice_color(s, shape, axis), slice_color(r, shape, axis));
        colors.insert(slice_color(r, shape, axis));
      }
      EXPECT_EQ(static_cast<int64_t>(colors.size()), n / shape[axis]);
    }
  }
  EXPECT_EQ(axis_slice(1, {2, 2}, 0), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(axis_slice(1, {2, 2}, 1), (std::vector<int64_t>{0, 1}));
}

TEST(MeshMath, ValidationMessages) {
  EXPECT_EQ(error_of({2, 2}, {"dp", "tp"}, 4), "<no error>");
  EXPECT_NE(error_of({2, 3}, {"dp", "tp"}, 4)
                .find("shape (2, 3) needs 6 ranks but WORLD_SIZE is 4: dp(2) * tp(3) = 6 != world_size(4). "
                      "Use a mesh "
                      "shape whose product is 4."),
            std::string::npos);
  EXPECT_NE(error_of({2, 2}, {"dp"}, 4).find("has 2 axes but 1 names"), std::string::npos);
  EXPECT_NE(error_of({2, 2}, {"dp", "dp"}, 4).find("\"dp\" is used twice"), std::string::npos);
  EXPECT_NE(error_of({0, 2}, {"dp", "tp"}, 0).find("axis 0 of shape (0, 2) has size 0"), std::string::npos);
  EXPECT_NE(error_of({}, {}, 4).find("shape is empty"), std::string::npos);
  EXPECT_NE(error_of({4}, {""}, 4).find("axis name is empty"), std::string::npos);
}

}  // namespace
