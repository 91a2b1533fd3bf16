// The sharding solver's core; see sharding_solver.h.
#include "plan/sharding_solver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"

namespace dtrain::plan {

namespace {

// A cost over some nodes' allowed options: table[index], the index row-major over `vars` (the last fastest).
struct Factor {
  std::vector<int> vars;
  std::vector<double> table;
};

// One node's elimination: its scope (the nodes it depended on then) and its best option for each of their
// assignments.
struct Eliminated {
  int var = 0;
  std::vector<int> scope;
  std::vector<int> best;  // index into the node's allowed options
};

void check_problem(const SolverProblem& p) {
  if (p.nodes.empty()) throw ValueError("sharding solver: the graph has no nodes. Record a step first.");
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const SolverNode& n = p.nodes[i];
    if (n.options.empty()) {
      throw ValueError(str_cat("sharding solver: node ", i, " (", n.name,
                               ") has no option. Every op needs at least one sharding strategy."));
    }
    if (n.pinned && (*n.pinned < 0 || *n.pinned >= static_cast<int>(n.options.size()))) {
      throw ValueError(str_cat("sharding solver: node ", i, " (", n.name, ") is pinned to option ", *n.pinned,
                               " but has ", n.options.size(), " options (0 to ", n.options.size() - 1, ")."));
    }
  }
  for (size_t e = 0; e < p.edges.size(); ++e) {
    const SolverEdge& g = p.edges[e];
    const int n = static_cast<int>(p.nodes.size());
    if (g.from < 0 || g.from >= n || g.to < 0 || g.to >= n || g.from == g.to) {
      throw ValueError(str_cat("sharding solver: edge ", e, " joins nodes ", g.from, " and ", g.to,
                               ": both must be distinct nodes of the ", n, "."));
    }
    const size_t a = p.nodes[g.from].options.size(), b = p.nodes[g.to].options.size();
    bool ok = g.cost_s.size() == a;
    for (const auto& row : g.cost_s) ok = ok && row.size() == b;
    if (!ok) {
      throw ValueError(str_cat("sharding solver: edge ", e, " (", p.nodes[g.from].name, " -> ",
                               p.nodes[g.to].name, ") needs a ", a, " x ", b,
                               " cost table (options of each end)."));
    }
  }
}

// The elimination order: each time the node whose elimination builds the smallest table (ties: lowest index).
// Depends on the graph only, not on the costs.
std::vector<int> elimination_order(const SolverProblem& p, const std::vector<std::vector<int>>& allowed) {
  const int n = static_cast<int>(p.nodes.size());
  std::vector<std::set<int>> adj(n);
  for (const auto& g : p.edges) {
    adj[g.from].insert(g.to);
    adj[g.to].insert(g.from);
  }
  std::vector<bool> done(n, false);
  std::vector<int> order;
  for (int k = 0; k < n; ++k) {
    int best = -1;
    double best_size = 0;
    for (int v = 0; v < n; ++v) {
      if (done[v]) continue;
      double size = static_cast<double>(allowed[v].size());
      for (int u : adj[v]) size *= static_cast<double>(allowed[u].size());
      if (best < 0 || size < best_size) {
        best = v;
        best_size = size;
      }
    }
    done[best] = true;
    order.push_back(best);
    for (int u : adj[best]) {  // its neighbours become one another's
      for (int w : adj[best]) {
        if (u != w) adj[u].insert(w);
      }
      adj[u].erase(best);
    }
    adj[best].clear();
  }
  return order;
}

struct Relaxed {
  std::vector<int> choice;
  double objective = 0;  // time + lambda * memory of `choice`, the minimum over every plan
  int width = 0;
};

// The plan minimising time + lambda * memory (exactly), by variable elimination in `order`.
Relaxed minimise(const SolverProblem& p, const std::vector<std::vector<int>>& allowed,
                 const std::vector<int>& order, double lambda, double time_weight,
                 const SolverOptions& opts) {
  const int n = static_cast<int>(p.nodes.size());
  std::vector<Factor> factors;
  for (int v = 0; v < n; ++v) {
    Factor f{{v}, {}};
    for (int o : allowed[v]) {
      const SolverOption& opt = p.nodes[v].options[o];
      f.table.push_back(time_weight * opt.time_s + lambda * opt.memory);
    }
    factors.push_back(std::move(f));
  }
  for (const auto& g : p.edges) {
    Factor f;
    f.vars = g.from < g.to ? std::vector<int>{g.from, g.to} : std::vector<int>{g.to, g.from};
    for (int a : allowed[f.vars[0]]) {
      for (int b : allowed[f.vars[1]]) {
        f.table.push_back(time_weight * (g.from < g.to ? g.cost_s[a][b] : g.cost_s[b][a]));
      }
    }
    factors.push_back(std::move(f));
  }
  std::vector<bool> live(factors.size(), true);
  std::vector<Eliminated> steps;
  double constant = 0;
  int width = 1;
  for (int v : order) {
    std::vector<size_t> mine;
    std::set<int> scope_set;
    for (size_t i = 0; i < factors.size(); ++i) {
      if (!live[i] || std::find(factors[i].vars.begin(), factors[i].vars.end(), v) == factors[i].vars.end())
        continue;
      mine.push_back(i);
      live[i] = false;
      for (int u : factors[i].vars) {
        if (u != v) scope_set.insert(u);
      }
    }
    const std::vector<int> scope(scope_set.begin(), scope_set.end());
    double size = static_cast<double>(allowed[v].size());
    for (int u : scope) size *= static_cast<double>(allowed[u].size());
    if (size > static_cast<double>(opts.max_table)) {
      throw ValueError(str_cat("sharding solver: eliminating node ", v, " (", p.nodes[v].name,
                               ") needs a table of ", size, " entries over ", scope.size() + 1,
                               " nodes, above the limit of ", opts.max_table,
                               ": the graph is too wide for exact elimination. Pin some placements (fewer "
                               "options) or merge ops that follow their input."));
    }
    width = std::max(width, static_cast<int>(scope.size()) + 1);
    // strides of each factor's variables within (scope, v), v last
    std::vector<int> all = scope;
    all.push_back(v);
    std::vector<std::vector<int64_t>> strides(mine.size());
    for (size_t k = 0; k < mine.size(); ++k) {
      const Factor& f = factors[mine[k]];
      std::vector<int64_t> s(all.size(), 0);
      int64_t stride = 1;
      for (int j = static_cast<int>(f.vars.size()) - 1; j >= 0; --j) {
        const auto at = std::find(all.begin(), all.end(), f.vars[j]) - all.begin();
        s[at] = stride;
        stride *= static_cast<int64_t>(allowed[f.vars[j]].size());
      }
      strides[k] = std::move(s);
    }
    int64_t entries = 1;
    for (int u : scope) entries *= static_cast<int64_t>(allowed[u].size());
    Factor out{scope, std::vector<double>(entries)};
    Eliminated e{v, scope, std::vector<int>(entries)};
    std::vector<int64_t> digit(scope.size(), 0);
    for (int64_t idx = 0; idx < entries; ++idx) {
      std::vector<int64_t> base(mine.size(), 0);
      for (size_t k = 0; k < mine.size(); ++k) {
        for (size_t j = 0; j < scope.size(); ++j) base[k] += digit[j] * strides[k][j];
      }
      double best = std::numeric_limits<double>::infinity();
      int best_o = 0;
      for (int64_t o = 0; o < static_cast<int64_t>(allowed[v].size()); ++o) {
        double sum = 0;
        for (size_t k = 0; k < mine.size(); ++k)
          sum += factors[mine[k]].table[base[k] + o * strides[k].back()];
        if (sum < best) {
          best = sum;
          best_o = static_cast<int>(o);
        }
      }
      out.table[idx] = best;
      e.best[idx] = best_o;
      for (int j = static_cast<int>(scope.size()) - 1; j >= 0; --j) {  // the odometer, last digit fastest
        if (++digit[j] < static_cast<int64_t>(allowed[scope[j]].size())) break;
        digit[j] = 0;
      }
    }
    if (scope.empty()) {
      constant += out.table[0];
    } else {
      factors.push_back(std::move(out));
      live.push_back(true);
    }
    steps.push_back(std::move(e));
  }
  // back from the last node eliminated: each one's scope was eliminated after it, so is chosen already
  std::vector<int> pick(n, -1);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    int64_t idx = 0;
    for (int u : it->scope) idx = idx * static_cast<int64_t>(allowed[u].size()) + pick[u];
    pick[it->var] = it->best[idx];
  }
  Relaxed r;
  r.objective = constant;
  r.width = width;
  for (int v = 0; v < n; ++v) r.choice.push_back(allowed[v][pick[v]]);
  return r;
}

// Single-node moves that lower the time and keep the memory within the budget, until none is left.
void improve_locally(const SolverProblem& p, const std::vector<std::vector<int>>& allowed,
                     std::vector<int>& choice) {
  const int n = static_cast<int>(p.nodes.size());
  std::vector<std::vector<int>> touching(n);
  for (size_t e = 0; e < p.edges.size(); ++e) {
    touching[p.edges[e].from].push_back(static_cast<int>(e));
    touching[p.edges[e].to].push_back(static_cast<int>(e));
  }
  double memory = solution_memory(p, choice);
  auto local_time = [&](int v, int o) {
    double t = p.nodes[v].options[o].time_s;
    for (int e : touching[v]) {
      const SolverEdge& g = p.edges[e];
      t += g.from == v ? g.cost_s[o][choice[g.to]] : g.cost_s[choice[g.from]][o];
    }
    return t;
  };
  for (int pass = 0; pass < 100; ++pass) {
    bool moved = false;
    for (int v = 0; v < n; ++v) {
      const double now = local_time(v, choice[v]);
      for (int o : allowed[v]) {
        const double m = memory - p.nodes[v].options[choice[v]].memory + p.nodes[v].options[o].memory;
        if (o == choice[v] || m > p.memory_budget || local_time(v, o) >= now - 1e-15) continue;
        choice[v] = o;
        memory = m;
        moved = true;
        break;
      }
    }
    if (!moved) break;
  }
}

// Branch and bound over the nodes' options, each subproblem bounded by Lagrangian relaxation of the budget.
class Search {
 public:
  Search(const SolverProblem& p, std::vector<int> order, const SolverOptions& opts)
      : p_(p), order_(std::move(order)), opts_(opts), start_(std::chrono::steady_clock::now()) {
    best.time_s = std::numeric_limits<double>::infinity();
  }

  SolverSolution best;  // the fastest plan within the budget found so far
  int solves = 0;

  Relaxed run(const std::vector<std::vector<int>>& allowed, double lambda, double time_weight) {
    ++solves;
    Relaxed r = minimise(p_, allowed, order_, lambda, time_weight, opts_);
    best.width = std::max(best.width, r.width);
    return r;
  }

  void offer(const std::vector<int>& choice) {
    const double t = solution_time(p_, choice), m = solution_memory(p_, choice);
    if (m <= p_.memory_budget && t < best.time_s) {
      best.choice = choice;
      best.time_s = t;
      best.memory = m;
    }
  }

  // A lower bound on the time of every plan within the budget that `allowed` leaves (+inf: none fits), and
  // every plan met on the way offered. `lean` and `fit`: the last plans over and within the budget, where
  // the node to branch on is found.
  double bound(const std::vector<std::vector<int>>& allowed, std::vector<int>* lean, std::vector<int>* fit) {
    const Relaxed r0 = run(allowed, 0, 1);
    offer(r0.choice);
    const double t0 = solution_time(p_, r0.choice), m0 = solution_memory(p_, r0.choice);
    if (m0 <= p_.memory_budget) return t0;  // the fastest of all fits: exact
    const Relaxed least = run(allowed, 1, 0);
    const double ml = solution_memory(p_, least.choice);
    if (ml > p_.memory_budget) return std::numeric_limits<double>::infinity();
    offer(least.choice);
    *lean = r0.choice;
    *fit = least.choice;
    double bound = t0;
    auto step = [&](double lambda) {
      const Relaxed r = run(allowed, lambda, 1);
      offer(r.choice);
      const double t = solution_time(p_, r.choice), m = solution_memory(p_, r.choice);
      bound = std::max(bound, t + lambda * (m - p_.memory_budget));
      const bool fits = m <= p_.memory_budget;
      *(fits ? fit : lean) = r.choice;
      return fits;
    };
    // lambda: from where memory starts to count, doubled until a plan fits, then bisected
    double lo = 0, hi = std::max(1e-12, t0) / std::max(1.0, m0) * 1e-6;
    // (every step's bound is valid: at a limit the search stops with the best of them)
    for (int k = 0; k < 200 && !out_of_limits() && !step(hi); ++k) {
      lo = hi;
      hi *= 2;
    }
    for (int k = 0; k < opts_.lambda_steps && !closed(bound) && !out_of_limits(); ++k) {
      const double mid = 0.5 * (lo + hi);
      (step(mid) ? hi : lo) = mid;
      if (hi - lo <= 1e-12 * hi) break;
    }
    return bound;
  }

  // The bound of the plans `allowed` leaves, refined by branching on one node's options at a time while
  // the bound is below the best plan and the limits allow.
  double branch(const std::vector<std::vector<int>>& allowed) {
    std::vector<int> lean, fit;
    const double own = bound(allowed, &lean, &fit);
    if (closed(own) || lean.empty() || out_of_limits()) return own;
    // the node whose option differs most in memory between the plan over the budget and the plan within it
    int v = -1;
    double most = -1;
    for (size_t u = 0; u < allowed.size(); ++u) {
      if (allowed[u].size() < 2 || lean[u] == fit[u]) continue;
      const double d = std::abs(p_.nodes[u].options[lean[u]].memory - p_.nodes[u].options[fit[u]].memory);
      if (d > most) {
        most = d;
        v = static_cast<int>(u);
      }
    }
    if (v < 0) return own;
    std::vector<int> tries{fit[v]};  // (the option of the plan that fits first: it finds good plans sooner)
    for (int o : allowed[v]) {
      if (o != fit[v]) tries.push_back(o);
    }
    double children = std::numeric_limits<double>::infinity();
    for (int o : tries) {
      // (a child left unexplored at a limit is bounded by its parent's bound alone)
      if (out_of_limits()) return own;
      std::vector<std::vector<int>> child = allowed;
      child[v] = {o};
      children = std::min(children, branch(child));
    }
    return std::max(own, children);
  }

 private:
  bool closed(double bound) const { return bound >= best.time_s - opts_.target_gap * std::abs(best.time_s); }
  bool out_of_limits() const {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return solves >= opts_.max_solves || secs >= opts_.time_limit_s;
  }

  const SolverProblem& p_;
  std::vector<int> order_;
  const SolverOptions& opts_;
  std::chrono::steady_clock::time_point start_;
};

void check_plan_size(const SolverProblem& p, const std::vector<int>& choice) {
  if (choice.size() != p.nodes.size()) {
    throw ValueError(
        str_cat("sharding solver: a plan of ", choice.size(), " choices for ", p.nodes.size(), " nodes."));
  }
}

}  // namespace

double solution_time(const SolverProblem& p, const std::vector<int>& choice) {
  check_plan_size(p, choice);
  double t = 0;
  for (size_t v = 0; v < choice.size(); ++v) t += p.nodes[v].options.at(choice[v]).time_s;
  for (const auto& g : p.edges) t += g.cost_s.at(choice[g.from]).at(choice[g.to]);
  return t;
}

double solution_memory(const SolverProblem& p, const std::vector<int>& choice) {
  check_plan_size(p, choice);
  double m = 0;
  for (size_t v = 0; v < choice.size(); ++v) m += p.nodes[v].options.at(choice[v]).memory;
  return m;
}

SolverSolution solve_sharding(const SolverProblem& p, const SolverOptions& opts) {
  check_problem(p);
  std::vector<std::vector<int>> allowed;
  for (const auto& n : p.nodes) {
    std::vector<int> a;
    if (n.pinned) {
      a.push_back(*n.pinned);
    } else {
      for (int o = 0; o < static_cast<int>(n.options.size()); ++o) a.push_back(o);
    }
    allowed.push_back(std::move(a));
  }
  Search search(p, elimination_order(p, allowed), opts);
  if (std::isfinite(p.memory_budget)) {  // no plan fits: say so, with the least any plan needs
    const Relaxed least = search.run(allowed, 1, 0);
    const double m = solution_memory(p, least.choice);
    if (m > p.memory_budget) {
      auto bytes = [](double b) {
        char text[64];
        std::snprintf(text, sizeof(text), "%.0f bytes (%.2f MiB)", b, b / 1048576);
        return std::string(text);
      };
      throw ValueError(str_cat("sharding solver: no plan fits the memory budget of ", bytes(p.memory_budget),
                               " per rank: the smallest needs ", bytes(m),
                               ". Raise the budget, or add ranks or placements that shard more."));
    }
    search.offer(least.choice);
  }
  const double bound = search.branch(allowed);
  SolverSolution& best = search.best;
  improve_locally(p, allowed, best.choice);
  best.time_s = solution_time(p, best.choice);
  best.memory = solution_memory(p, best.choice);
  best.lower_bound_s = std::min(bound, best.time_s);
  best.gap = best.time_s > 0 ? std::max(0.0, (best.time_s - best.lower_bound_s) / best.time_s) : 0;
  best.solves = search.solves;
  return best;
}

}  // namespace dtrain::plan
