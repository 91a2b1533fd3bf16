// Redistribution planning; see redistribute_plan.h.
#include "tensor/redistribute_plan.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>

#include "core/error.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor {

namespace {

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

double local_bytes(const RedistributeProblem& p, const Placements& state) {
  double n = static_cast<double>(p.element_size);
  for (int64_t s : max_local_shape(p.shape, p.mesh_shape, state)) n *= static_cast<double>(s);
  return n;
}

// No axis after `axis` shards `dim`.
bool innermost(const Placements& state, int axis, int dim) {
  for (size_t b = axis + 1; b < state.size(); ++b) {
    if (state[b].is_shard(dim)) return false;
  }
  return true;
}

// The step that moves `axis` from state[axis] to `to`, if it is legal (see the table in the header).
bool step_kind(const Placements& state, int axis, const Placement& to, StepKind* kind) {
  const Placement& from = state[axis];
  if (from == to) return false;
  if (from.is_shard()) {
    if (!innermost(state, axis, from.dim)) return false;
    if (to.is_replicate()) return *kind = StepKind::kAllGather, true;
    if (to.is_shard() && innermost(state, axis, to.dim)) return *kind = StepKind::kAllToAll, true;
    return false;
  }
  if (from.is_replicate()) {
    if (to.is_shard() && innermost(state, axis, to.dim)) return *kind = StepKind::kLocalSlice, true;
    if (to.is_partial()) return *kind = StepKind::kLocalPartial, true;
    return false;
  }
  // from is Partial
  if (to.is_replicate()) return *kind = StepKind::kAllReduce, true;
  if (to.is_shard() && innermost(state, axis, to.dim)) return *kind = StepKind::kReduceScatter, true;
  bool sum_avg = (from.op == ReduceOp::kSum && to.is_partial() && to.op == ReduceOp::kAvg) ||
                 (from.op == ReduceOp::kAvg && to.is_partial() && to.op == ReduceOp::kSum);
  if (sum_avg) return *kind = StepKind::kLocalScale, true;
  return false;
}

RedistributeStep make_step(const RedistributeProblem& p, const Placements& state, int axis,
                           const Placement& to, StepKind kind, const CostModel& model) {
  RedistributeStep s{kind, axis, state[axis], to, state, 0, 0, 0};
  s.after[axis] = to;
  double before = local_bytes(p, state), after = local_bytes(p, s.after);
  double k = static_cast<double>(p.mesh_shape[axis]);
  switch (kind) {
    case StepKind::kAllGather:
      s.bytes = after * (k - 1) / k;
      break;
    case StepKind::kAllReduce:
      s.bytes = before * 2 * (k - 1) / k;
      break;
    case StepKind::kReduceScatter:
      s.bytes = before * (k - 1) / k;
      break;
    case StepKind::kAllToAll:
      s.bytes = before * (k - 1) / k;
      break;
    case StepKind::kLocalSlice:
      s.bytes = after;
      break;
    case StepKind::kLocalPartial:
      s.bytes = to.op == ReduceOp::kSum ? before : 0;
      break;
    case StepKind::kLocalScale:
      s.bytes = before;
      break;
  }
  s.peak_bytes = std::max(before, after);
  // An axis of size 1 moves nothing: every step on it is a relabelling.
  s.seconds = p.mesh_shape[axis] == 1 || s.bytes == 0 ? 0 : model.seconds(kind, axis, s.bytes);
  return s;
}

double step_cost(const RedistributeStep& s, const CostModel& model) {
  return s.seconds + model.memory_weight() * s.peak_bytes;
}

void add(RedistributePlan& plan, RedistributeStep s, const CostModel& model) {
  plan.seconds += s.seconds;
  plan.cost += step_cost(s, model);
  plan.steps.push_back(std::move(s));
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += str_cat(i ? ", " : "", v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

std::string time_str(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f ms", seconds * 1e3);
  return buf;
}

}  // namespace

int RedistributePlan::collectives() const {
  return static_cast<int>(std::count_if(steps.begin(), steps.end(),
                                        [](const RedistributeStep& s) { return is_collective(s.kind); }));
}

std::string RedistributePlan::explain() const {
  std::string out = str_cat("redistribute ", to_string(problem.from), " -> ", to_string(problem.to),
                            " on mesh ", shape_str(problem.mesh_shape), ", global shape ",
                            shape_str(problem.shape), ", ", problem.element_size, " B per element\n");
  if (steps.empty()) return out + "  nothing to do: the placements are equal\n";
  if (bounded) {
    out += str_cat("  (the search stopped after ", kMaxPlanStates,
                   " placement states, too many on this mesh: the naive route below)\n");
  }
  double bytes = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    char line[200];
    std::snprintf(line, sizeof(line), "  %zu. axis %d: %-7s -> %-7s %-15s %12.0f B  predicted %s\n", i + 1,
                  s.axis, s.from.to_string().c_str(), s.to.to_string().c_str(), to_string(s.kind), s.bytes,
                  time_str(s.seconds).c_str());
    out += line;
    bytes += s.bytes;
  }
  return out + str_cat("  total: ", collectives(), " collective(s), ", static_cast<int64_t>(bytes),
                       " B per rank, predicted ", time_str(seconds), "\n");
}

std::vector<RedistributeStep> next_steps(const RedistributeProblem& p, const Placements& state,
                                         const CostModel& model) {
  std::vector<Placement> targets{Replicate()};
  for (int d = 0; d < static_cast<int>(p.shape.size()); ++d) targets.push_back(Shard(d));
  for (ReduceOp op : kOps) targets.push_back(Partial(op));
  std::vector<RedistributeStep> out;
  for (int a = 0; a < static_cast<int>(state.size()); ++a) {
    for (const Placement& to : targets) {
      StepKind kind;
      if (step_kind(state, a, to, &kind)) out.push_back(make_step(p, state, a, to, kind, model));
    }
  }
  return out;
}

RedistributePlan plan_redistribute(const RedistributeProblem& p, const CostModel& model) {
  DTRAIN_ASSERT(p.from.size() == p.mesh_shape.size() && p.to.size() == p.mesh_shape.size(), "placements ",
                to_string(p.from), " -> ", to_string(p.to), " on a ", p.mesh_shape.size(), "-d mesh");
  DTRAIN_ASSERT(model.axes() >= static_cast<int>(p.mesh_shape.size()), "cost model for ", model.axes(),
                " axes");
  using Entry = std::pair<double, Placements>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  std::map<Placements, double> dist;
  std::map<Placements, RedistributeStep> via;  // the step that reached each state
  dist[p.from] = 0;
  queue.push({0, p.from});
  size_t expanded = 0;
  while (!queue.empty()) {
    auto [d, state] = queue.top();
    queue.pop();
    if (d > dist[state]) continue;
    if (state == p.to) break;
    if (++expanded > kMaxPlanStates) {  // a mesh of many axes: too many states to search
      RedistributePlan naive = naive_plan(p, model);
      naive.bounded = true;
      return naive;
    }
    for (RedistributeStep& s : next_steps(p, state, model)) {
      double nd = d + step_cost(s, model);
      auto it = dist.find(s.after);
      if (it == dist.end() || nd < it->second) {
        dist[s.after] = nd;
        queue.push({nd, s.after});
        via.insert_or_assign(s.after, s);
      }
    }
  }
  if (!dist.count(p.to)) {
    throw NotSupportedError(str_cat("redistribute: no plan takes ", to_string(p.from), " to ",
                                    to_string(p.to), ". Redistribute through Replicate() first."));
  }
  std::vector<RedistributeStep> reversed;
  for (Placements s = p.to; s != p.from;) {
    const RedistributeStep& step = via.at(s);
    reversed.push_back(step);
    s = step.after;
    s[step.axis] = step.from;
  }
  RedistributePlan plan{p, {}, 0, 0};
  for (auto it = reversed.rbegin(); it != reversed.rend(); ++it) add(plan, *it, model);
  return plan;
}

void check_problem(const RedistributeProblem& p) {
  int64_t ranks = 1;
  for (int64_t a : p.mesh_shape) {
    if (a < 1) {
      throw ValueError(str_cat("redistribute: mesh shape ", shape_str(p.mesh_shape), " has an axis of size ",
                               a, "; every axis needs at least 1 rank."));
    }
    if (ranks > kMaxRanks / a) {
      throw ValueError(str_cat("redistribute: mesh shape ", shape_str(p.mesh_shape), " has more than ",
                               kMaxRanks, " ranks. Use a mesh the size of a real job."));
    }
    ranks *= a;
  }
  double bytes = static_cast<double>(p.element_size);
  for (int64_t d : p.shape) {
    if (d < 0) throw ValueError(str_cat("redistribute: shape ", shape_str(p.shape), " has a negative dim."));
    bytes *= static_cast<double>(d);
  }
  if (bytes > static_cast<double>(int64_t{1} << 56)) {
    throw ValueError(
        str_cat("redistribute: a tensor of shape ", shape_str(p.shape), " holds ", bytes,
                " bytes, more than 2^56; byte counts would overflow. Use a real tensor's shape."));
  }
}

RedistributePlan naive_plan(const RedistributeProblem& p, const CostModel& model) {
  RedistributePlan plan{p, {}, 0, 0};
  Placements state = p.from;
  auto go = [&](int axis, const Placement& to) {
    StepKind kind;
    if (!step_kind(state, axis, to, &kind)) return;
    RedistributeStep s = make_step(p, state, axis, to, kind, model);
    state = s.after;
    add(plan, std::move(s), model);
  };
  for (int a = static_cast<int>(state.size()) - 1; a >= 0; --a) go(a, Replicate());
  for (int a = 0; a < static_cast<int>(state.size()); ++a) go(a, p.to[a]);
  DTRAIN_ASSERT(state == p.to, "naive route ended at ", to_string(state), " not ", to_string(p.to));
  return plan;
}

PlanPtr PlanCache::get(const RedistributeProblem& problem) {
  Key key{problem.shape, problem.element_size, problem.mesh_shape, problem.from, problem.to};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second.second);
    return it->second.first;
  }
  auto plan = std::make_shared<const RedistributePlan>(plan_redistribute(problem, model_));
  if (plans_.size() >= capacity_) {
    plans_.erase(recent_.back());
    recent_.pop_back();
  }
  recent_.push_front(key);
  plans_.emplace(std::move(key), std::make_pair(plan, recent_.begin()));
  return plan;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

}  // namespace dtrain::tensor
