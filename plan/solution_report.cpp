// explain_solution, diff_solutions; see solution_report.h.
#include "plan/solution_report.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tensor/redistribute_plan.h"

namespace dtrain::plan {

namespace {

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof(b), f, x);
  return b;
}

std::string bytes_text(double b) {
  if (b >= 1048576) return fmt("%.1f MiB", b / 1048576);
  if (b >= 1024) return fmt("%.1f KiB", b / 1024);
  return fmt("%.0f B", b);
}

std::string shape_text(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += str_cat(i ? ", " : "", sizes[i]);
  return s + "]";
}

// An outside value's label: its name, else what it is to the step (state it writes, or an input).
std::string outside_label(const StepRecord& r, int v) {
  if (!r.values[v].name.empty()) return r.values[v].name;
  for (const RecordedValue& x : r.values) {
    if (x.previous == v) return str_cat("state #", v);
  }
  return str_cat("input #", v);
}

// A value's label in a redistribution: an outside value's, or the op that made it.
std::string value_label(const StepRecord& r, int v) {
  int root = v;
  while (r.values[root].previous >= 0) root = r.values[root].previous;
  if (r.values[root].producer < 0) return outside_label(r, root);
  return str_cat("output of op #", r.values[v].producer, " ", r.ops[r.values[v].producer].name);
}

struct Totals {
  double compute = 0, moved = 0, bytes = 0;
  int collectives = 0;
};

Totals totals(const StepRecord& r, const StepGraph& g, const SolverSolution& s, const comm::CostModel& comm) {
  Totals t;
  for (size_t n = 0; n < g.problem.nodes.size(); ++n)
    t.compute += g.problem.nodes[n].options[s.choice[n]].time_s;
  for (const Redistribution& d : redistributions(r, g, s.choice, comm)) {
    t.moved += d.seconds;
    t.bytes += d.bytes;
    t.collectives += d.collectives;
  }
  return t;
}

std::string summary(const StepRecord& r, const StepGraph& g, const SolverSolution& s,
                    const comm::CostModel& comm) {
  const Totals t = totals(r, g, s, comm);
  return str_cat("predicted step: ", fmt("%.2f", s.time_s * 1e3), " ms per rank (ops ",
                 fmt("%.2f", t.compute * 1e3), " ms, redistributions ", fmt("%.2f", t.moved * 1e3),
                 " ms: ", t.collectives, " collectives moving ", bytes_text(t.bytes),
                 " per rank); memory at the step's peak: ", bytes_text(s.memory),
                 " per rank (everything replicated: ", bytes_text(g.replicated_bytes), ")\n");
}

}  // namespace

std::string explain_solution(const StepRecord& r, const StepGraph& g, const SolverSolution& s,
                             const comm::CostModel& comm) {
  std::string out = summary(r, g, s, comm);
  out += str_cat(
      "solver: ", g.problem.nodes.size(), " nodes, ", g.problem.edges.size(), " edges; ",
      s.gap == 0 ? std::string("proven optimal (gap 0)") : str_cat("gap ", fmt("%.2f%%", s.gap * 100)),
      ", elimination width ", s.width, ", ", s.solves, " eliminations",
      std::isfinite(g.problem.memory_budget) ? str_cat(", budget ", bytes_text(g.problem.memory_budget))
                                             : std::string(", no memory budget"),
      "\n\nplacements of the parameters, the optimizer's state and the inputs:\n");
  for (size_t n = 0; n < g.op.size(); ++n) {
    if (g.value[n] < 0) continue;
    const int v = g.value[n];
    out += str_cat("  ", outside_label(r, v), " ", shape_text(r.values[v].sizes), "  ",
                   tensor::to_string(g.placements[n][s.choice[n]]), "\n");
  }
  const std::vector<Redistribution> moves = redistributions(r, g, s.choice, comm);
  out += str_cat("\nredistributions, in step order (", moves.size(), "):\n");
  for (const Redistribution& d : moves) {
    out += str_cat("  ", d.op < 0 ? std::string("step end") : str_cat("op #", d.op, " ", r.ops[d.op].name),
                   ": ", value_label(r, d.value), " ", shape_text(r.values[d.value].sizes), " ",
                   tensor::to_string(d.from), " -> ", tensor::to_string(d.to), ", ", d.collectives,
                   " collective", d.collectives == 1 ? "" : "s", ", ", bytes_text(d.bytes), ", ",
                   fmt("%.3f", d.seconds * 1e3), " ms\n");
  }
  return out;
}

std::string diff_solutions(const StepRecord& r, const StepGraph& g, const SolverSolution& a,
                           const SolverSolution& b, const std::string& a_label, const std::string& b_label,
                           const comm::CostModel& comm) {
  std::string out = str_cat("placements that differ (", a_label, " -> ", b_label, "):\n");
  int differ = 0;
  for (size_t n = 0; n < g.op.size(); ++n) {
    if (g.value[n] < 0 || a.choice[n] == b.choice[n]) continue;
    ++differ;
    const int v = g.value[n];
    out += str_cat("  ", outside_label(r, v), " ", shape_text(r.values[v].sizes), "  ",
                   tensor::to_string(g.placements[n][a.choice[n]]), " -> ",
                   tensor::to_string(g.placements[n][b.choice[n]]), "\n");
  }
  int ops = 0;
  for (size_t n = 0; n < g.op.size(); ++n) ops += g.op[n] >= 0 && a.choice[n] != b.choice[n];
  if (differ == 0) out += "  (none)\n";
  out += str_cat("ops run another way: ", ops, "\n", a_label, ": ", summary(r, g, a, comm), b_label, ": ",
                 summary(r, g, b, comm));
  return out;
}

}  // namespace dtrain::plan
