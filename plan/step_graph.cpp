// build_step_graph; see step_graph.h.
#include "plan/step_graph.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include "core/error.h"
#include "tensor/redistribute_plan.h"
#include "tensor/shard_math.h"

namespace dtrain::plan {

namespace {

double numel(const std::vector<int64_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), 1.0, [](double a, int64_t b) { return a * b; });
}

// The share of a tensor one rank holds under `p`: 1 over the sizes of the axes that shard it.
double share(const tensor::Placements& p, const std::vector<int64_t>& mesh_shape) {
  double s = 1;
  for (size_t a = 0; a < p.size(); ++a) {
    if (p[a].is_shard()) s /= static_cast<double>(mesh_shape[a]);
  }
  return s;
}

std::string value_name(const StepRecord& r, int v) {
  std::string dims;
  for (int64_t d : r.values[v].sizes) dims += str_cat(dims.empty() ? "" : ", ", d);
  return str_cat("value #", v, " [", dims, "]");
}

}  // namespace

bool writes(const StepRecord& record, int op, int v) {
  for (int w : record.ops[op].outputs) {
    if (record.values[w].previous == v) return true;
  }
  return false;
}

int StepGraph::source(const StepRecord& r, int v) const {
  return r.values[v].producer >= 0 ? node_of_op[r.values[v].producer] : node_of_value[v];
}

const tensor::Placements& StepGraph::placement(const StepRecord& r, int v, int option) const {
  const int p = r.values[v].producer;
  if (p < 0) return placements[node_of_value[v]][option];
  const int ret = r.ops[p].output_return[output_index[v]];
  DTRAIN_ASSERT(ret >= 0, "value ", v, " of ", r.ops[p].name, " is written but not returned");
  return r.ops[p].choices[option].outputs[ret];
}

StepGraph build_step_graph(const StepRecord& r, const std::vector<int64_t>& mesh_shape,
                           const comm::CostModel& comm, double memory_budget) {
  const int axes = static_cast<int>(mesh_shape.size());
  StepGraph g;
  g.problem.memory_budget = memory_budget;
  // Nodes: every op, then every outside value.
  g.mesh_shape = mesh_shape;
  g.node_of_op.assign(r.ops.size(), -1);
  g.node_of_value.assign(r.values.size(), -1);
  std::vector<int>& node_of_op = g.node_of_op;
  std::vector<int>& node_of_value = g.node_of_value;
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const RecordedOp& op = r.ops[i];
    if (!op.ruled) {
      throw ValueError(
          str_cat("sharding solver: op #", i, " ", op.name,
                  " has no sharding rule (DTensor would run it on gathered inputs), so no layout "
                  "can be chosen for it. Record the step with the mesh shape to plan for (record_step(step, "
                  "mesh_shape)); if it was, the op needs a rule in tensor/rules/."));
    }
    node_of_op[i] = static_cast<int>(g.op.size());
    g.op.push_back(static_cast<int>(i));
    g.value.push_back(-1);
    g.placements.emplace_back();
  }
  for (int v : r.outside_values()) {
    node_of_value[v] = static_cast<int>(g.op.size());
    g.op.push_back(-1);
    g.value.push_back(v);
    std::vector<tensor::Placements> valid;
    const auto ndim = static_cast<int64_t>(r.values[v].sizes.size());
    std::vector<tensor::Placement> options{tensor::Replicate()};
    for (int d = 0; d < ndim; ++d) options.push_back(tensor::Shard(d));
    for (const tensor::Placements& p : tensor::all_placements(options, axes)) {
      try {
        tensor::check_placements("solver", p, ndim, axes);
        valid.push_back(p);
      } catch (const Error&) {
      }
    }
    g.placements.push_back(std::move(valid));
  }

  g.output_index.assign(r.values.size(), -1);
  for (const RecordedOp& op : r.ops) {
    for (size_t k = 0; k < op.outputs.size(); ++k) g.output_index[op.outputs[k]] = static_cast<int>(k);
  }
  auto source = [&](int v) { return g.source(r, v); };
  auto placement = [&](int v, int option) -> const tensor::Placements& { return g.placement(r, v, option); };
  auto options_of = [&](int node) {
    return g.op[node] >= 0 ? r.ops[g.op[node]].choices.size() : g.placements[node].size();
  };

  // Memory: each tensor's storage (a chain of in-place writes shares one) lives from its first value's
  // making to its last value's last read; outside ones, and what the next step reads, the whole step.
  const int n_ops = static_cast<int>(r.ops.size());
  std::vector<int> root(r.values.size());
  for (size_t v = 0; v < r.values.size(); ++v) {
    root[v] = r.values[v].previous >= 0 ? root[r.values[v].previous] : static_cast<int>(v);
  }
  std::vector<int> born(r.values.size(), n_ops), dies(r.values.size(), -1);
  std::vector<bool> allocates(r.values.size(), false);
  for (size_t v = 0; v < r.values.size(); ++v) {
    const int p = r.values[v].producer;
    if (static_cast<int>(v) != root[v]) continue;
    born[v] = p < 0 ? 0 : p;
    dies[v] = p < 0 ? n_ops - 1 : p;
    allocates[v] = p < 0 || !r.ops[p].view;
  }
  for (int i = 0; i < n_ops; ++i) {
    for (int v : r.ops[i].inputs) dies[root[v]] = std::max(dies[root[v]], i);
  }
  std::vector<double> live(n_ops, 0);
  for (size_t v = 0; v < r.values.size(); ++v) {
    if (!allocates[v]) continue;
    const double bytes = numel(r.values[v].sizes) * static_cast<double>(r.values[v].element_size);
    for (int i = born[v]; i <= dies[v]; ++i) live[i] += bytes;
  }
  g.peak_op = static_cast<int>(std::max_element(live.begin(), live.end()) - live.begin());
  g.replicated_bytes = live[g.peak_op];

  // Options: time and memory.
  g.problem.nodes.resize(g.op.size());
  for (size_t n = 0; n < g.op.size(); ++n) {
    SolverNode& node = g.problem.nodes[n];
    node.options.resize(options_of(static_cast<int>(n)));
    if (g.op[n] >= 0) {
      const RecordedOp& op = r.ops[g.op[n]];
      node.name = str_cat("op #", g.op[n], " ", op.name);
      for (size_t o = 0; o < op.choices.size(); ++o) {
        const tensor::Choice& c = op.choices[o];
        double work = 1;  // the smallest share of any tensor it shards
        for (size_t k = 0; k < c.inputs.size(); ++k) {
          if (numel(r.values[op.inputs[op.choice_inputs[k]]].sizes) > 1)
            work = std::min(work, share(c.inputs[k], mesh_shape));
        }
        std::string name;
        for (const auto& p : c.outputs) name += tensor::to_string(p);
        node.options[o] = SolverOption{name, op.seconds * work, 0};
      }
    } else {
      node.name = value_name(r, g.value[n]);
      for (size_t o = 0; o < g.placements[n].size(); ++o)
        node.options[o] = SolverOption{tensor::to_string(g.placements[n][o]), 0, 0};
    }
  }
  for (size_t v = 0; v < r.values.size(); ++v) {
    if (!allocates[v] || born[v] > g.peak_op || dies[v] < g.peak_op) continue;
    const double bytes = numel(r.values[v].sizes) * static_cast<double>(r.values[v].element_size);
    const int n = source(static_cast<int>(v));
    for (size_t o = 0; o < g.problem.nodes[n].options.size(); ++o) {
      g.problem.nodes[n].options[o].memory +=
          bytes * share(placement(static_cast<int>(v), static_cast<int>(o)), mesh_shape);
    }
  }

  // Edges: a value from the node that places it to each op that reads it, and a written outside value's last
  // state back to its node. Edges between one pair of nodes add up.
  tensor::PlanCache plans(comm);
  std::map<std::pair<int, int>, size_t> edge_of;
  // `written`: the op writes the value in place, which keeps its placements (the handler cannot move a
  // tensor it writes): any other placement is forbidden.
  auto add_edge = [&](int v, int to, const std::function<const tensor::Placements&(int)>& to_placement,
                      bool written = false) {
    const int from = source(v);
    const RecordedValue& value = r.values[v];
    if (from == to) return;
    std::vector<std::vector<double>> cost(options_of(from), std::vector<double>(options_of(to), 0));
    for (size_t a = 0; a < cost.size(); ++a) {
      const tensor::Placements& src = placement(v, static_cast<int>(a));
      for (size_t b = 0; b < cost[a].size(); ++b) {
        tensor::RedistributeProblem rp{value.sizes, value.element_size, mesh_shape, src,
                                       to_placement(static_cast<int>(b))};
        cost[a][b] = src == rp.to ? 0 : written ? kForbidden_s : plans.get(rp)->seconds;
      }
    }
    auto it = edge_of.find({from, to});
    if (it != edge_of.end()) {
      auto& t = g.problem.edges[it->second].cost_s;
      for (size_t a = 0; a < t.size(); ++a)
        for (size_t b = 0; b < t[a].size(); ++b) t[a][b] += cost[a][b];
      return;
    }
    it = edge_of.find({to, from});
    if (it != edge_of.end()) {
      auto& t = g.problem.edges[it->second].cost_s;
      for (size_t a = 0; a < cost.size(); ++a)
        for (size_t b = 0; b < cost[a].size(); ++b) t[b][a] += cost[a][b];
      return;
    }
    edge_of[{from, to}] = g.problem.edges.size();
    g.problem.edges.push_back(SolverEdge{from, to, std::move(cost)});
  };
  for (int i = 0; i < n_ops; ++i) {
    const RecordedOp& op = r.ops[i];
    for (size_t k = 0; k < op.choice_inputs.size(); ++k) {
      const int v = op.inputs[op.choice_inputs[k]];
      add_edge(
          v, node_of_op[i], [&](int b) -> const tensor::Placements& { return op.choices[b].inputs[k]; },
          writes(r, i, v));
    }
  }
  std::vector<int> last(r.values.size(), -1);  // per root: its last value
  for (size_t v = 0; v < r.values.size(); ++v) last[root[v]] = static_cast<int>(v);
  for (int v : r.outside_values()) {
    const int final_value = last[v];
    if (final_value == v) continue;
    const int n = node_of_value[v];
    add_edge(final_value, n, [&](int b) -> const tensor::Placements& { return g.placements[n][b]; });
  }
  return g;
}

void pin_value(StepGraph& g, const StepRecord& r, const std::string& name,
               const tensor::Placements& placements) {
  std::string names, options;
  int pinned = 0;
  for (size_t n = 0; n < g.value.size(); ++n) {
    if (g.value[n] < 0 || r.values[g.value[n]].name.empty()) continue;
    const std::string& here = r.values[g.value[n]].name;
    if (here != name) {
      if (names.size() < 300) names += str_cat(names.empty() ? "" : ", ", here);
      continue;
    }
    const auto& opts = g.placements[n];
    const auto it = std::find(opts.begin(), opts.end(), placements);
    if (it == opts.end()) {
      for (const auto& o : opts) options += str_cat(options.empty() ? "" : ", ", tensor::to_string(o));
      throw ValueError(str_cat("sharding solver: cannot pin ", name, " ", value_name(r, g.value[n]), " to ",
                               tensor::to_string(placements), ": it can take ", options,
                               ". Pin it to one of those."));
    }
    g.problem.nodes[n].pinned = static_cast<int>(it - opts.begin());
    ++pinned;
  }
  if (pinned == 0) {
    throw ValueError(str_cat("sharding solver: no value named ", name, " to pin; the named ones are ",
                             names.empty() ? std::string("(none)") : names,
                             ". Name a parameter as named_parameters() does."));
  }
}

std::vector<Redistribution> redistributions(const StepRecord& r, const StepGraph& g,
                                            const std::vector<int>& choice, const comm::CostModel& comm) {
  tensor::PlanCache plans(comm);
  std::vector<Redistribution> out;
  auto add = [&](int op, int v, const tensor::Placements& to) {
    const tensor::Placements& from = g.placement(r, v, choice[g.source(r, v)]);
    if (from == to) return;
    Redistribution d{op, v, from, to};
    tensor::PlanPtr plan = plans.get({r.values[v].sizes, r.values[v].element_size, g.mesh_shape, from, to});
    for (const auto& step : plan->steps) d.bytes += step.bytes;
    d.seconds = plan->seconds;
    d.collectives = plan->collectives();
    out.push_back(std::move(d));
  };
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const RecordedOp& op = r.ops[i];
    const tensor::Choice& c = op.choices[choice[g.node_of_op[i]]];
    for (size_t k = 0; k < op.choice_inputs.size(); ++k)
      add(static_cast<int>(i), op.inputs[op.choice_inputs[k]], c.inputs[k]);
  }
  std::vector<int> last(r.values.size(), -1);
  for (size_t v = 0; v < r.values.size(); ++v) {
    int root = static_cast<int>(v);
    while (r.values[root].previous >= 0) root = r.values[root].previous;
    last[root] = static_cast<int>(v);
  }
  for (int v : r.outside_values()) {
    if (last[v] != v) add(-1, last[v], g.placements[g.node_of_value[v]][choice[g.node_of_value[v]]]);
  }
  return out;
}

}  // namespace dtrain::plan
