// Pure tier: the sharding solver's core (plan/sharding_solver.h) against exhaustive search, on graphs whose
// answer is known: a mixed optimum, random graphs with cycles under tight budgets, pins, and its errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "core/error.h"
#include "plan/sharding_solver.h"

using namespace dtrain;
using namespace dtrain::plan;

namespace {

// Every plan, the fastest within the budget: (time, memory, choice); time +inf when none fits.
struct Exhaustive {
  double time = std::numeric_limits<double>::infinity();
  std::vector<int> choice;
};
Exhaustive exhaustive(const SolverProblem& p) {
  Exhaustive best;
  std::vector<int> c(p.nodes.size(), 0);
  std::function<void(size_t)> go = [&](size_t v) {
    if (v == p.nodes.size()) {
      if (solution_memory(p, c) > p.memory_budget) return;
      const double t = solution_time(p, c);
      if (t < best.time) {
        best.time = t;
        best.choice = c;
      }
      return;
    }
    for (int o = 0; o < static_cast<int>(p.nodes[v].options.size()); ++o) {
      if (p.nodes[v].pinned && *p.nodes[v].pinned != o) continue;
      c[v] = o;
      go(v + 1);
    }
  };
  go(0);
  return best;
}

std::string error_of(const SolverProblem& p, const SolverOptions& o = {}) {
  try {
    solve_sharding(p, o);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "<no error>";
}

// Options "R" (replicated: the whole op's time, its whole memory) and "S" (sharded over 2: half of each).
SolverNode two_way(const std::string& name, double time, double memory) {
  return {name, {{"R", time, memory}, {"S", time / 2, memory / 2}}, std::nullopt};
}

// A redistribution cost between two-way nodes: free where the layouts match, `to_r` from S to R (a
// gather), `to_s` from R to S (a local slice).
SolverEdge edge(int from, int to, double to_r, double to_s) { return {from, to, {{0, to_s}, {to_r, 0}}}; }

}  // namespace

// A chain whose best plan is neither every node replicated nor every node sharded: the middle op is cheap
// to shard but its neighbours' gathers are dear, the ends are cheap to replicate.
TEST(ShardingSolver, FindsAMixedOptimumOnAChain) {
  SolverProblem p;
  p.nodes = {two_way("embed", 1, 10),
             two_way("mlp1", 10, 100),
             two_way("mlp2", 10, 100),
             {"loss", {{"R", 1, 1}, {"S", 5, 1}}, std::nullopt}};
  p.edges = {edge(0, 1, 3, 0), edge(1, 2, 3, 0), edge(2, 3, 2, 0)};
  const auto s = solve_sharding(p);
  const auto e = exhaustive(p);
  EXPECT_EQ(s.choice, e.choice);
  EXPECT_EQ(s.choice, (std::vector<int>{1, 1, 1, 0}));  // sharded until the loss, which wants the whole
  EXPECT_DOUBLE_EQ(s.time_s, e.time);
  EXPECT_EQ(s.gap, 0);
  // under a budget every plan meets, the answer is the same; under one that forces sharding the mlp
  // weights, still mixed
  p.memory_budget = 120;
  const auto t = solve_sharding(p);
  EXPECT_DOUBLE_EQ(t.time_s, exhaustive(p).time);
  EXPECT_LE(t.memory, 120);
}

// Random graphs with cycles (a chain with skip edges, like a residual stream), 2 to 4 options a node, under
// budgets from loose to nearly the least memory: the solver's plan fits, its bound is below the true
// optimum, its time is within its own gap of it, and branch and bound closes every gap.
TEST(ShardingSolver, MatchesExhaustiveSearchOnRandomGraphsUnderBudgets) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  int proven = 0, cases = 0, cut_open = 0;
  for (int g = 0; g < 60; ++g) {
    SolverProblem p;
    const int n = 5 + g % 5;
    for (int v = 0; v < n; ++v) {
      SolverNode node{"op" + std::to_string(v), {}, std::nullopt};
      const int k = 2 + static_cast<int>(rng() % 3);
      for (int o = 0; o < k; ++o) node.options.push_back({"o" + std::to_string(o), u(rng), 1 + 9 * u(rng)});
      p.nodes.push_back(node);
    }
    auto add = [&](int a, int b) {
      SolverEdge e{a, b, {}};
      for (size_t i = 0; i < p.nodes[a].options.size(); ++i) {
        e.cost_s.emplace_back();
        for (size_t j = 0; j < p.nodes[b].options.size(); ++j) e.cost_s.back().push_back(i == j ? 0 : u(rng));
      }
      p.edges.push_back(e);
    };
    for (int v = 0; v + 1 < n; ++v) add(v, v + 1);
    for (int v = 0; v + 2 < n; v += 2) add(v, v + 2);
    double least = 0, most = 0;
    for (const auto& node : p.nodes) {
      double lo = 1e30, hi = 0;
      for (const auto& o : node.options) {
        lo = std::min(lo, o.memory);
        hi = std::max(hi, o.memory);
      }
      least += lo;
      most += hi;
    }
    for (double f : {1.0, 0.6, 0.3, 0.1, 0.02}) {
      p.memory_budget = least + f * (most - least);
      const auto e = exhaustive(p);
      const auto s = solve_sharding(p);
      ++cases;
      EXPECT_LE(s.memory, p.memory_budget + 1e-9);
      EXPECT_DOUBLE_EQ(s.time_s, solution_time(p, s.choice));
      EXPECT_LE(s.lower_bound_s, e.time + 1e-9) << "graph " << g << " budget " << f;
      EXPECT_GE(s.time_s, e.time - 1e-9);
      EXPECT_LE(s.time_s - e.time, s.gap * s.time_s + 1e-9) << "graph " << g << " budget " << f;
      if (s.gap < 1e-9) {
        ++proven;
        EXPECT_NEAR(s.time_s, e.time, 1e-9);
      }
      // cut short (three eliminations): still a plan that fits, an honest bound, a gap that covers the miss
      SolverOptions few;
      few.max_solves = 3;
      const auto c = solve_sharding(p, few);
      EXPECT_LE(c.memory, p.memory_budget + 1e-9);
      EXPECT_LE(c.lower_bound_s, e.time + 1e-9);
      EXPECT_LE(c.time_s - e.time, c.gap * c.time_s + 1e-9);
      cut_open += c.gap > 1e-9;
    }
  }
  // (graphs this small close their gap within the search's limits: every plan is proven optimal)
  EXPECT_EQ(proven, cases);
  EXPECT_GT(cut_open, 0);  // (the limits do cut the search short somewhere: the check above is not empty)
}

TEST(ShardingSolver, PinsHoldAndCostWhatTheyCost) {
  SolverProblem p;
  p.nodes = {two_way("a", 4, 4), two_way("b", 4, 4), two_way("c", 4, 4)};
  p.edges = {edge(0, 1, 1, 0), edge(1, 2, 1, 0)};
  EXPECT_EQ(solve_sharding(p).choice, (std::vector<int>{1, 1, 1}));
  p.nodes[1].pinned = 0;  // the user keeps b replicated
  const auto s = solve_sharding(p);
  EXPECT_EQ(s.choice[1], 0);
  EXPECT_DOUBLE_EQ(s.time_s, exhaustive(p).time);
}

TEST(ShardingSolver, ErrorsNameTheNodeTheEdgeOrTheBudget) {
  SolverProblem p;
  p.nodes = {two_way("wte", 1, 100), two_way("head", 1, 50)};
  p.edges = {edge(0, 1, 1, 0)};
  p.memory_budget = 60;
  const std::string budget = error_of(p);
  EXPECT_NE(budget.find("budget of 60 bytes"), std::string::npos) << budget;
  EXPECT_NE(budget.find("smallest needs 75 bytes"), std::string::npos) << budget;
  p.memory_budget = 1000;
  p.nodes[1].pinned = 2;
  const std::string pin = error_of(p);
  EXPECT_NE(pin.find("(head) is pinned to option 2 but has 2 options"), std::string::npos) << pin;
  p.nodes[1].pinned.reset();
  p.edges[0].cost_s = {{0, 1}};
  const std::string shape = error_of(p);
  EXPECT_NE(shape.find("edge 0 (wte -> head) needs a 2 x 2 cost table"), std::string::npos) << shape;
  p.edges[0] = {1, 1, {{0, 0}, {0, 0}}};
  EXPECT_NE(error_of(p).find("joins nodes 1 and 1"), std::string::npos);
  p.nodes[0].options.clear();
  EXPECT_NE(error_of(p).find("node 0 (wte) has no option"), std::string::npos);
  EXPECT_NE(error_of(SolverProblem{}).find("no nodes"), std::string::npos);
}

// A complete graph is as wide as it is large: past the table limit it is an error naming a node, not a
// search that never ends.
TEST(ShardingSolver, TooWideAGraphIsAnError) {
  SolverProblem p;
  for (int v = 0; v < 16; ++v) {
    p.nodes.push_back(
        {"op" + std::to_string(v), {{"a", 1, 1}, {"b", 1, 1}, {"c", 1, 1}, {"d", 1, 1}}, std::nullopt});
  }
  for (int a = 0; a < 16; ++a) {
    for (int b = a + 1; b < 16; ++b)
      p.edges.push_back({a, b, std::vector<std::vector<double>>(4, {0, 1, 1, 1})});
  }
  SolverOptions o;
  o.max_table = 1 << 16;
  const std::string e = error_of(p, o);
  EXPECT_NE(e.find("too wide for exact elimination"), std::string::npos) << e;
  EXPECT_NE(e.find("needs a table of"), std::string::npos) << e;
}

// A transformer-shaped graph (48 blocks of 12 ops on a residual stream, 8 options an op) solves exactly and
// quickly: the width stays that of one block's residual, not the graph's size.
TEST(ShardingSolver, DeepBlockGraphsStayNarrow) {
  SolverProblem p;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  int prev_residual = -1;
  for (int b = 0; b < 48; ++b) {
    const int first = static_cast<int>(p.nodes.size());
    for (int k = 0; k < 12; ++k) {
      SolverNode node{"block" + std::to_string(b) + ".op" + std::to_string(k), {}, std::nullopt};
      for (int o = 0; o < 8; ++o) node.options.push_back({"o" + std::to_string(o), u(rng), 1 + u(rng)});
      p.nodes.push_back(node);
    }
    auto add = [&](int a, int c) {
      std::vector<std::vector<double>> cost(8, std::vector<double>(8));
      for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 8; ++j) cost[i][j] = i == j ? 0 : u(rng);
      }
      p.edges.push_back({a, c, cost});
    };
    if (prev_residual >= 0) add(prev_residual, first);
    for (int k = 0; k + 1 < 12; ++k) add(first + k, first + k + 1);
    if (prev_residual >= 0) add(prev_residual, first + 11);  // the residual add
    add(first, first + 6);                                   // the block's own skip
    prev_residual = first + 11;
  }
  p.memory_budget = 0.9 * 48 * 12 * 2;
  const auto start = std::chrono::steady_clock::now();
  const auto s = solve_sharding(p);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LE(s.memory, p.memory_budget);
  EXPECT_LE(s.width, 4);
  EXPECT_LT(s.gap, 0.05);
  RecordProperty("solve_s", std::to_string(secs));
  RecordProperty("width", s.width);
  RecordProperty("gap", std::to_string(s.gap));
}
