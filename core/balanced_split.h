// The one balanced-split formula (DESIGN §4, "Uneven shards are exact"): n items over k parts, part r holding
// n/k + (r < n%k) items, the first n%k parts one more (16 over 3: 6, 5, 5). DTensor's Shard
// (tensor/shard_math.h), tensor parallel's parts, ZeRO's and deterministic mode's flat shards, and the
// trainer's rows of a batch all cut through it. Pure; header-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace dtrain {

// Items [start, start + count) of one part.
struct Range {
  int64_t start = 0;
  int64_t count = 0;
};

// Part `r` of `k` of `n` items. Requires k > 0, 0 <= r < k, n >= 0.
inline Range balanced_part(int64_t n, int64_t k, int64_t r) {
  DTRAIN_ASSERT(k > 0 && r >= 0 && r < k && n >= 0, "balanced_part: bad part");
  const int64_t base = n / k, extra = n % k;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

// Every part's count, in part order.
inline std::vector<int64_t> balanced_counts(int64_t n, int64_t k) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(k, 0)));
  for (int64_t r = 0; r < k; ++r) out.push_back(balanced_part(n, k, r).count);
  return out;
}

}  // namespace dtrain
