// The whole-step sharding solver's core (DESIGN §9, docs/planning.md "The sharding solver"): a graph whose
// nodes each take one of a few options (an op's or a parameter's placements), each option with a time and a
// memory per rank, and whose edges cost a time for every pair of options at their two ends (the
// redistribution one option's output needs to reach the other's input). It chooses one option per node to
// minimise the total time with the total memory within a budget.
//
// Method: exact minimisation of time + lambda * memory by variable elimination (dynamic programming over the
// graph's structure: a chain or a tree costs linear time; a graph of small treewidth, such as a transformer's
// blocks with their residual stream, stays small), a search over lambda (Lagrangian relaxation of the
// budget: every lambda gives a lower bound on the optimum), and branch and bound over the options of the
// nodes where the plans just over and just within the budget differ, until the bound meets the best plan or
// a limit is reached. The best plan within the budget is reported with its gap to the bound; a gap of 0 is a
// proof of optimality. Pure: no tensors, no ranks.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::plan {

struct SolverOption {
  std::string name;   // e.g. "S(0)R" (placements per mesh axis)
  double time_s = 0;  // compute (and any communication inside the op) under this option
  double memory = 0;  // bytes per rank this option holds at the step's peak
};

struct SolverNode {
  std::string name;                   // the op or parameter, for errors and reports
  std::vector<SolverOption> options;  // at least one
  std::optional<int> pinned;          // the user's constraint: this option, always
};

struct SolverEdge {
  int from = 0, to = 0;                     // node indices (from != to)
  std::vector<std::vector<double>> cost_s;  // [option of from][option of to]: the redistribution's seconds
};

struct SolverProblem {
  std::vector<SolverNode> nodes;
  std::vector<SolverEdge> edges;
  double memory_budget = std::numeric_limits<double>::infinity();  // bytes per rank
};

struct SolverOptions {
  // Largest table variable elimination may build (entries); a graph wider than this is an error naming the
  // node whose elimination would exceed it.
  int64_t max_table = int64_t{1} << 24;
  int lambda_steps = 40;  // bisection steps of the search over lambda, per subproblem
  double target_gap =
      1e-9;  // a subproblem is closed once its bound is this close to the best plan (relative)
  // Limits of the branch and bound: eliminations, and seconds. Reaching one ends the search with the best
  // plan found and the gap left (reported, never hidden).
  int max_solves = 20000;
  double time_limit_s = 10;
};

struct SolverSolution {
  std::vector<int> choice;   // option per node
  double time_s = 0;         // total: the options' and the edges'
  double memory = 0;         // total over the nodes
  double lower_bound_s = 0;  // no plan within the budget is faster than this
  double gap = 0;            // (time_s - lower_bound_s) / time_s; 0: proven optimal
  int solves = 0;            // variable eliminations run (one per lambda tried)
  int width = 0;             // the largest table's number of variables (the elimination order's width)
};

// Time and memory of `choice` (validated: one option in range per node).
double solution_time(const SolverProblem& p, const std::vector<int>& choice);
double solution_memory(const SolverProblem& p, const std::vector<int>& choice);

// The best plan within the budget. ValueError for a malformed problem (naming the node or edge), for a pin
// out of range, for a graph too wide (naming the node), and when no plan fits the budget (naming the budget
// and the smallest memory any plan needs).
SolverSolution solve_sharding(const SolverProblem& p, const SolverOptions& opts = {});

}  // namespace dtrain::plan
