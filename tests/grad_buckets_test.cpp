// Unit tier: the pure parts of the gradient-bucket engine that data parallel and ZeRO share
// (parallel/detail/grad_buckets.h), looping over ranks in one process as the shard math tests do: how a flat
// buffer is cut over the ranks (ZeRO's shards, deterministic mode's parts), and how parameters fill buckets.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "parallel/detail/grad_buckets.h"

namespace {

using dtrain::parallel::detail::bucket_groups;
using dtrain::parallel::detail::BucketItem;
using dtrain::parallel::detail::flat_cut;
using dtrain::parallel::detail::kDetBlock;

// Every element of [0, numel) is owned by exactly one rank, in rank order: rank r's part starts where rank
// r - 1's ends.
TEST(FlatCut, EveryElementHasExactlyOneOwnerAtEveryWorldSize) {
  for (bool deterministic : {false, true}) {
    for (int64_t n = 1; n <= 4; ++n) {
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, kDetBlock, 3 * kDetBlock + 5,
                            int64_t{10007}}) {
        const std::vector<int64_t> counts = flat_cut(numel, n, deterministic);
        ASSERT_EQ(static_cast<int64_t>(counts.size()), n);
        std::vector<int> owners(static_cast<size_t>(numel), 0);
        int64_t start = 0;
        for (int64_t r = 0; r < n; ++r) {
          ASSERT_GE(counts[r], 0);
          for (int64_t e = start; e < start + counts[r]; ++e) ++owners[e];
          start += counts[r];
        }
        EXPECT_EQ(start, numel) << "n " << n << " numel " << numel;
        for (int64_t e = 0; e < numel; ++e) ASSERT_EQ(owners[e], 1) << "element " << e;
        const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
        if (!deterministic) {
          EXPECT_LE(*hi - *lo, 1) << "balanced: n " << n << " numel " << numel;
        } else {
          // whole blocks: every non-empty part starts at a block boundary
          int64_t offset = 0;
          for (int64_t r = 0; r < n; ++r) {
            if (counts[r] > 0) EXPECT_EQ(offset % kDetBlock, 0) << "rank " << r << " starts inside a block";
            offset += counts[r];
          }
          // balanced in blocks, the last block possibly partial
          EXPECT_LT(*hi - *lo, 2 * kDetBlock) << "n " << n << " numel " << numel;
        }
      }
    }
  }
}

TEST(BucketGroups, CapsDtypesAndOrder) {
  const auto f = at::kFloat, d = at::kDouble;
  // bytes:                      0   1    2    3    4    5    6
  std::vector<BucketItem> items{{4, f}, {4, f}, {8, f}, {4, d}, {4, d}, {40, d}, {4, d}};
  std::vector<int> order{6, 5, 4, 3, 2, 1, 0};  // backward's order: the reverse of registration
  const auto groups = bucket_groups(order, items, /*first_cap=*/4, /*cap=*/12);
  // first bucket: 4 bytes at most (item 6); 40 bytes alone; 4 + 4 doubles; the dtype changes; 8 + 4 floats
  // fill 12; then the last float
  const std::vector<std::vector<int>> expected{{6}, {5}, {4, 3}, {2, 1}, {0}};
  EXPECT_EQ(groups, expected);
}

TEST(BucketGroups, EveryParameterInExactlyOneBucketWithinItsCap) {
  for (int64_t cap : {int64_t{1}, int64_t{16}, int64_t{100}, int64_t{1} << 20}) {
    std::vector<BucketItem> items;
    std::vector<int> order;
    for (int i = 0; i < 50; ++i) {
      items.push_back({4 * (1 + (i * 7) % 11), i % 13 == 0 ? at::kDouble : at::kFloat});
      order.push_back(49 - i);
    }
    const auto groups = bucket_groups(order, items, cap / 4 + 1, cap);
    std::vector<int> seen;
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t bytes = 0;
      for (int i : groups[g]) {
        bytes += items[i].bytes;
        EXPECT_EQ(items[i].dtype, items[groups[g].front()].dtype) << "one dtype per bucket";
        seen.push_back(i);
      }
      const int64_t limit = g == 0 ? cap / 4 + 1 : cap;
      EXPECT_TRUE(bytes <= limit || groups[g].size() == 1)
          << "bucket " << g << " holds " << bytes << " bytes";
    }
    EXPECT_EQ(seen, order) << "every parameter once, in order";
  }
}

}  // namespace
