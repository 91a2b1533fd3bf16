// Pure tier: placements and shard arithmetic, checked by looping over every rank and coordinate.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "mesh/mesh_math.h"
#include "tensor/shard_math.h"

using namespace dtrain;
using namespace dtrain::tensor;

namespace {

TEST(ShardMath, BalancedSplitTilesEveryDim) {
  for (int64_t n = 0; n <= 13; ++n) {
    for (int64_t k = 1; k <= 5; ++k) {
      int64_t next = 0, lo = n, hi = 0;
      for (int64_t r = 0; r < k; ++r) {
        EXPECT_EQ(shard_offset(n, k, r), next) << n << " " << k << " " << r;
        EXPECT_EQ(shard_size(n, k, r), n / k + (r < n % k ? 1 : 0));
        next += shard_size(n, k, r);
        lo = std::min(lo, shard_size(n, k, r));
        hi = std::max(hi, shard_size(n, k, r));
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1);
    }
  }
}

// Every element is held by exactly (product of the non-sharding axes' sizes) coordinates, and every chunk is
// the nested balanced split.
TEST(ShardMath, LocalChunksCoverTheTensorExactly) {
  const std::vector<int64_t> shape{7, 5};
  std::vector<Placement> options{Replicate(), Shard(0), Shard(1), Partial()};
  for (auto mesh_shape : std::vector<std::vector<int64_t>>{{3}, {2, 2}, {2, 3}}) {
    std::vector<Placements> all = all_placements(options, static_cast<int>(mesh_shape.size()));
    for (const Placements& pl : all) {
      int64_t copies = 1;
      for (size_t a = 0; a < pl.size(); ++a) {
        if (!pl[a].is_shard()) copies *= mesh_shape[a];
      }
      std::map<std::pair<int64_t, int64_t>, int64_t> held;
      auto max_shape = max_local_shape(shape, mesh_shape, pl);
      for (int64_t r = 0; r < mesh::mesh_size(mesh_shape); ++r) {
        LocalChunk c = local_chunk(shape, mesh_shape, pl, mesh::coordinate_of(r, mesh_shape));
        for (size_t d = 0; d < shape.size(); ++d) EXPECT_LE(c.shape[d], max_shape[d]);
        for (int64_t i = 0; i < c.shape[0]; ++i) {
          for (int64_t j = 0; j < c.shape[1]; ++j) ++held[{c.offset[0] + i, c.offset[1] + j}];
        }
      }
      ASSERT_EQ(static_cast<int64_t>(held.size()), shape[0] * shape[1]) << to_string(pl);
      for (auto& [ij, n] : held) EXPECT_EQ(n, copies) << to_string(pl);
    }
  }
}

TEST(ShardMath, NestedShardsSplitInAxisOrder) {
  // 7 rows over (2, 3): axis 0 gives 4 | 3, then axis 1 splits 4 into 2,1,1 and 3 into 1,1,1.
  std::vector<int64_t> mesh_shape{2, 3};
  Placements pl{Shard(0), Shard(0)};
  std::vector<int64_t> sizes, offsets;
  for (int64_t r = 0; r < 6; ++r) {
    auto c = local_chunk({7}, mesh_shape, pl, mesh::coordinate_of(r, mesh_shape));
    sizes.push_back(c.shape[0]);
    offsets.push_back(c.offset[0]);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 1, 1, 1, 1, 1}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 3, 4, 5, 6}));
}

TEST(ShardMath, PlacementValidation) {
  EXPECT_EQ(check_placements("t", {Shard(-1)}, 2, 1), (Placements{Shard(1)}));
  try {
    check_placements("distribute_tensor", {Shard(2)}, 2, 1);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(
        e.what(),
        "distribute_tensor: Shard(2) is invalid for a 2-d tensor (dims 0..1). Use Shard(0), Shard(1) or "
        "Replicate().");
  }
  EXPECT_THROW(check_placements("t", {Replicate()}, 2, 2), ValueError);
  EXPECT_THROW(check_placements("t", {Partial(ReduceOp::kSum), Partial(ReduceOp::kMax)}, 2, 2),
               NotSupportedError);
  EXPECT_THROW(check_placements("t", {Partial(ReduceOp::kMax), Partial(ReduceOp::kMin)}, 2, 2),
               NotSupportedError);
  EXPECT_THROW(check_placements("t", {Partial(ReduceOp::kMin), Partial(ReduceOp::kAvg)}, 2, 2),
               NotSupportedError);
  EXPECT_NO_THROW(check_placements("t", {Partial(ReduceOp::kMax), Partial(ReduceOp::kMax)}, 2, 2));
  EXPECT_NO_THROW(
      check_placements("t", {Partial(ReduceOp::kMin), Replicate(), Partial(ReduceOp::kMin)}, 2, 3));
  EXPECT_NO_THROW(check_placements("t", {Partial(ReduceOp::kSum), Partial(ReduceOp::kAvg)}, 2, 2));
  EXPECT_EQ(to_string(Placements{Shard(0), Replicate(), Partial(ReduceOp::kMax)}), "(S(0), R, P(max))");
}

// parse_placements reads what to_string writes, the long names, and reports a bad part with its text.
TEST(ShardMath, ParsePlacements) {
  for (const Placements& p :
       all_placements({Shard(0), Shard(2), Replicate(), Partial(ReduceOp::kSum), Partial(ReduceOp::kAvg),
                       Partial(ReduceOp::kMax), Partial(ReduceOp::kMin)},
                      2)) {
    EXPECT_EQ(parse_placements(to_string(p)), p) << to_string(p);
  }
  EXPECT_EQ(parse_placements("Shard(1), Replicate(), Partial(avg)"),
            (Placements{Shard(1), Replicate(), Partial(ReduceOp::kAvg)}));
  EXPECT_EQ(parse_placements("S(0)"), (Placements{Shard(0)}));
  EXPECT_EQ(parse_placement(" P "), Partial(ReduceOp::kSum));
  for (const char* bad : {"S(x)", "Q", "P(prod)", "S(1", "S(0),"}) {
    EXPECT_THROW(parse_placements(bad), ValueError) << bad;
  }
  try {
    parse_placements("R, S(a)");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("placement \"S(a)\" is not one of"), std::string::npos) << e.what();
  }
}

}  // namespace

// The storage a geometry needs, worked out by hand for a few layouts.
TEST(ShardMath, StorageExtentIsTheLastPositionPlusOne) {
  EXPECT_EQ(storage_extent({7, 5}, {5, 1}, 0), 35);
  EXPECT_EQ(storage_extent({3}, {5}, 2), 13);  // select(1, 2) of a [3, 5]
  EXPECT_EQ(storage_extent({5, 7}, {1, 5}, 0), 35);
  EXPECT_EQ(storage_extent({4, 0}, {1, 1}, 6), 6);  // no element
  EXPECT_EQ(storage_extent({}, {}, 4), 5);          // a 0-d tensor at position 4
}
