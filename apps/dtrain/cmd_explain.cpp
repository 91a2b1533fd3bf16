// `dtrain explain`; see cmd_explain.h.
#include "apps/dtrain/cmd_explain.h"

#include <cstdio>

#include "comm/cost_model.h"
#include "core/error.h"
#include "core/units.h"
#include "tensor/redistribute_plan.h"
#include "tensor/shard_math.h"

namespace dtrain::apps {

namespace {

std::vector<int64_t> parse_sizes(const std::string& what, const std::string& s) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string part = s.substr(start, comma - start);
    try {
      size_t used = 0;
      long long v = std::stoll(part, &used);
      if (used != part.size() || v < 1) throw std::invalid_argument(part);
      out.push_back(v);
    } catch (const std::exception&) {
      throw ValueError(str_cat("explain: ", what, " '", s,
                               "' is not a comma-separated list of sizes of at least 1. Write e.g. 2,2."));
    }
    start = comma + 1;
  }
  return out;
}

int element_size(const std::string& dtype) {
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  return 4;
}

}  // namespace

CLI::App* add_explain_command(CLI::App& app, ExplainOptions& opts) {
  CLI::App* c = app.add_subcommand(
      "explain",
      "Show the DTensor redistribution plan (steps, bytes, predicted time) for a tensor on a mesh");
  c->add_option("--mesh", opts.mesh, "Mesh axis sizes, e.g. 2,2")->capture_default_str();
  c->add_option("--shape", opts.shape, "Global tensor shape, e.g. 1024,1024")->capture_default_str();
  c->add_option("--from", opts.from, "Source placements, one per axis, e.g. \"S(0),P(sum)\" (required)");
  c->add_option("--to", opts.to, "Target placements, e.g. \"R,S(1)\" (required)");
  c->add_option("--dtype", opts.dtype, "Element type")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16", "int32", "int64"}))
      ->capture_default_str();
  c->add_option("--profile", opts.profile,
                "Cost model from `dtrain bench comm --profile FILE` (default: built-in figures)");
  CLI::App* solve = c->add_subcommand(
      "solve",
      "Solve the layout of `dtrain train`'s GPT step with the whole-step sharding solver and explain it: "
      "each "
      "parameter's placements, each redistribution with the op that needs it, its bytes and predicted time, "
      "the predicted step time and memory per rank (docs/planning.md). Takes every option of `dtrain train`");
  add_train_options(solve, opts.train);
  solve->add_option("--mesh", opts.mesh, "Mesh axis sizes to plan for, e.g. 2 or 2,2")->capture_default_str();
  solve->add_option("--budget", opts.budget, "Memory per rank the plan must fit, e.g. 8M (default: none)");
  solve->add_option("--compare-budget", opts.compare_budget,
                    "Solve again under this budget and show what differs between the two plans");
  solve->add_option(
      "--pin", opts.pins,
      "Keep a parameter's placements, NAME=PLACEMENTS, e.g. h0.mlp.fc.weight=S(0) (repeatable)");
  solve
      ->add_option("--batch-axis", opts.batch_axis,
                   "The mesh axis the batch stays sharded over (the inputs S(0) on it, R on the others)")
      ->check(CLI::Range(0, 16));
  opts.solve_command = solve;
  return c;
}

int run_explain(const ExplainOptions& opts) {
  using namespace dtrain::tensor;
  if (opts.solve_command != nullptr && opts.solve_command->parsed()) {
    train::SolveOptions s;
    s.mesh = parse_sizes("--mesh", opts.mesh);
    train::TrainOptions o = train_options(opts.train);
    s.profile = o.profile == "builtin" ? "" : o.profile;
    if (!opts.budget.empty())
      s.budget = static_cast<double>(parse_bytes("explain solve: --budget", opts.budget));
    if (!opts.compare_budget.empty()) {
      s.compare_budget =
          static_cast<double>(parse_bytes("explain solve: --compare-budget", opts.compare_budget));
    }
    for (const std::string& pin : opts.pins) {
      const size_t eq = pin.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == pin.size()) {
        throw ValueError(str_cat("explain solve: --pin '", pin,
                                 "' is not NAME=PLACEMENTS. Write e.g. --pin h0.mlp.fc.weight=S(0)."));
      }
      s.pins.emplace_back(pin.substr(0, eq), pin.substr(eq + 1));
    }
    s.batch_axis = opts.batch_axis;
    std::fputs(train::solve_gpt(o, s).c_str(), stdout);
    return 0;
  }
  if (opts.from.empty() || opts.to.empty()) {
    throw ValueError(
        "explain: --from and --to are required: the placements to redistribute from and to, one per mesh "
        "axis "
        "(e.g. --from \"S(0),P(sum)\" --to \"R,S(1)\"). To solve a whole step's layout instead, use "
        "`dtrain explain solve`.");
  }
  RedistributeProblem p;
  p.mesh_shape = parse_sizes("--mesh", opts.mesh);
  p.shape = parse_sizes("--shape", opts.shape);
  p.element_size = element_size(opts.dtype);
  check_problem(p);
  const int axes = static_cast<int>(p.mesh_shape.size());
  const auto ndim = static_cast<int64_t>(p.shape.size());
  p.from = check_placements("explain --from", parse_placements(opts.from), ndim, axes);
  p.to = check_placements("explain --to", parse_placements(opts.to), ndim, axes);
  CostModel model = opts.profile.empty() ? CostModel::defaults(axes)
                                         : CostModel::from_profile(comm::read_profile(opts.profile), axes);
  RedistributePlan plan = plan_redistribute(p, model);
  RedistributePlan naive = naive_plan(p, model);
  std::printf("cost model: %s\n", opts.profile.empty() ? "built-in defaults" : opts.profile.c_str());
  std::printf("chosen plan:\n%s", plan.explain().c_str());
  std::printf("naive route (gather to Replicate, then re-shard):\n%s", naive.explain().c_str());
  return 0;
}

}  // namespace dtrain::apps
