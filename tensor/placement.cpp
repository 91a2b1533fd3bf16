// Placement; see placement.h.
#include "tensor/placement.h"

#include <tuple>

#include "core/error.h"

namespace dtrain::tensor {

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::kShard:
      return str_cat("S(", dim, ")");
    case Kind::kReplicate:
      return "R";
    case Kind::kPartial:
      return str_cat("P(", comm::to_string(op), ")");
  }
  return "?";
}

bool operator<(const Placement& a, const Placement& b) {
  auto key = [](const Placement& p) {
    return std::make_tuple(static_cast<int>(p.kind), p.is_shard() ? p.dim : -1,
                           p.is_partial() ? static_cast<int>(p.op) : -1);
  };
  return key(a) < key(b);
}

Placement Shard(int dim) { return Placement{Placement::Kind::kShard, dim, ReduceOp::kSum}; }
Placement Replicate() { return Placement{Placement::Kind::kReplicate, -1, ReduceOp::kSum}; }
Placement Partial(ReduceOp op) { return Placement{Placement::Kind::kPartial, -1, op}; }

std::string to_string(const Placements& placements) {
  std::string s = "(";
  for (size_t i = 0; i < placements.size(); ++i) s += str_cat(i ? ", " : "", placements[i].to_string());
  return s + ")";
}

std::vector<Placements> all_placements(const std::vector<Placement>& options, int axes) {
  std::vector<Placements> all{{}};
  for (int a = 0; a < axes; ++a) {
    std::vector<Placements> next;
    for (const auto& p : all) {
      for (const auto& o : options) {
        next.push_back(p);
        next.back().push_back(o);
      }
    }
    all = std::move(next);
  }
  return all;
}

}  // namespace dtrain::tensor
