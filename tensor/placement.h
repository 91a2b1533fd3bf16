// Placement: how a DTensor's data is laid out along one mesh axis (DESIGN §4). Shard(dim) splits tensor dim
// `dim` over the axis, Replicate() keeps a full copy on every rank of the axis, Partial(op) holds per-rank
// values whose reduction with `op` is the tensor. Say *axis* for a mesh axis and *dim* for a tensor
// dimension.
#pragma once

#include <string>
#include <vector>

#include "comm/types.h"

namespace dtrain::tensor {

using comm::ReduceOp;

struct Placement {
  enum class Kind { kShard, kReplicate, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = -1;                  // kShard only
  ReduceOp op = ReduceOp::kSum;  // kPartial only

  bool is_shard() const { return kind == Kind::kShard; }
  bool is_shard(int d) const { return kind == Kind::kShard && dim == d; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_partial() const { return kind == Kind::kPartial; }
  // "S(0)", "R", "P(sum)"
  std::string to_string() const;

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind != Kind::kShard || a.dim == b.dim) &&
           (a.kind != Kind::kPartial || a.op == b.op);
  }
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
  // An arbitrary total order, for maps keyed by placements.
  friend bool operator<(const Placement& a, const Placement& b);
};

// The three constructors, named as in PyTorch's DTensor.
Placement Shard(int dim);
Placement Replicate();
Placement Partial(ReduceOp op = ReduceOp::kSum);

using Placements = std::vector<Placement>;

// "(S(0), R)"
std::string to_string(const Placements& placements);

// Parses "S(0)", "R", "P(sum)" (also Shard(0), Replicate(), Partial(avg); Partial alone is sum), and a
// comma-separated tuple of them, with or without parentheses: "(S(0), R)". ValueError naming the bad part.
Placement parse_placement(const std::string& text);
Placements parse_placements(const std::string& text);

// Every tuple of `axes` placements drawn from `options` (options^axes tuples, the last axis varying fastest).
std::vector<Placements> all_placements(const std::vector<Placement>& options, int axes);

}  // namespace dtrain::tensor
