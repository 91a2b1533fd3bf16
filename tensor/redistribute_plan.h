// Redistribution planning (DESIGN §4): turns placements A into placements B on one mesh as a sequence of
// single-axis steps, found by Dijkstra over placement tuples with edge cost alpha + beta * bytes per (axis,
// collective) plus a peak-memory term. Pure: sizes, placements and a cost model in, a plan out; the executor
// runs it.
//
//   step             from -> to        valid when (a = the axis, "innermost": no later axis shards that dim)
//   all_gather       S(d) -> R         d innermost on a
//   all_to_all       S(i) -> S(j)      i and j innermost on a
//   all_reduce       P(op) -> R        always
//   reduce_scatter   P(op) -> S(d)     d innermost on a
//   local slice      R -> S(d)         d innermost on a
//   local partial    R -> P(op)        always (sum: coordinate 0 keeps the value, the others hold zeros)
//   local scale      P(sum) <-> P(avg) always
// The innermost rule keeps nested shards of one dim contiguous, so every step moves whole local blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/cost_model.h"
#include "tensor/placement.h"

namespace dtrain::tensor {

// The collective cost model (comm/cost_model.h), which the planner plans with and DTensor's records name.
using comm::CostModel;
using comm::StepKind;

struct RedistributeProblem {
  std::vector<int64_t> shape;       // global shape
  int64_t element_size = 4;         // bytes per element
  std::vector<int64_t> mesh_shape;  // one size per axis
  Placements from, to;              // valid placements (check_placements)
};

struct RedistributeStep {
  StepKind kind;
  int axis;
  Placement from, to;     // the placement of `axis` before and after
  Placements after;       // every axis's placement after this step
  double bytes = 0;       // per rank: bus bytes of a collective, copied bytes of a local step
  double seconds = 0;     // predicted by the cost model
  double peak_bytes = 0;  // the larger of the local buffers before and after
};

struct RedistributePlan {
  RedistributeProblem problem;
  std::vector<RedistributeStep> steps;
  double seconds = 0;    // predicted time of all steps
  double cost = 0;       // what the search minimised: seconds plus the memory term
  bool bounded = false;  // the search stopped at kMaxPlanStates: this is the naive route
  // Collectives that move data (steps on axes of size 1 are relabellings and issue none).
  int collectives() const;
  // The chosen steps with predicted bytes and time, one per line.
  std::string explain() const;
};

// The legal single-axis steps from `state`, each with its predicted cost.
std::vector<RedistributeStep> next_steps(const RedistributeProblem& problem, const Placements& state,
                                         const CostModel& model);

// ValueError when a problem given by hand (dtrain explain) is out of range: a mesh axis below 1, more than
// kMaxRanks ranks, or a tensor over 2^56 bytes (byte counts must not overflow).
constexpr int64_t kMaxRanks = int64_t{1} << 24;
void check_problem(const RedistributeProblem& problem);

// The search visits at most this many placement states (a mesh of up to 4 axes stays below it). Past
// it, the plan is the naive route and says so (RedistributePlan::bounded), in well under a second.
constexpr size_t kMaxPlanStates = 5000;

// The cheapest plan (ties broken by a fixed order of placements, so plans are deterministic). The empty plan
// when from == to. Placements must be valid for the shape (check_placements).
RedistributePlan plan_redistribute(const RedistributeProblem& problem, const CostModel& model);

// The reference route: gather everything to Replicate (innermost axis first), then slice and mark partial in
// axis order. Every plan costs at most this.
RedistributePlan naive_plan(const RedistributeProblem& problem, const CostModel& model);

using PlanPtr = std::shared_ptr<const RedistributePlan>;

// Plans keyed by (shape, element size, mesh shape, from, to), at most `capacity` of them: past it the least
// recently used plan is dropped (dynamic shapes would otherwise grow the cache without bound). A plan handed
// out stays valid while its holder keeps it. Thread-safe. One cache per cost model.
class PlanCache {
 public:
  static constexpr size_t kDefaultCapacity = 4096;
  explicit PlanCache(CostModel model, size_t capacity = kDefaultCapacity)
      : model_(std::move(model)), capacity_(std::max<size_t>(capacity, 1)) {}
  PlanPtr get(const RedistributeProblem& problem);
  size_t size() const;
  size_t capacity() const { return capacity_; }
  const CostModel& model() const { return model_; }

 private:
  using Key = std::tuple<std::vector<int64_t>, int64_t, std::vector<int64_t>, Placements, Placements>;
  CostModel model_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<Key> recent_;  // guarded by mu_; most recently used first
  std::map<Key, std::pair<PlanPtr, std::list<Key>::iterator>> plans_;  // guarded by mu_
};

}  // namespace dtrain::tensor
