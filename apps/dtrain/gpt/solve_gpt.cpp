// solve_gpt; see solve_gpt.h.
#include "apps/dtrain/gpt/solve_gpt.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "comm/rehearsal.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "plan/optimizer_state.h"
#include "plan/solution_report.h"
#include "plan/solve_step.h"
#include "plan/step_graph.h"
#include "plan/step_record.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"

namespace dtrain::train {

namespace {

std::string mib(double b) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", b / 1048576);
  return text;
}

}  // namespace

std::string solve_gpt(const TrainOptions& o, const SolveOptions& s) {
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;  // bytes, as dtrain train
  cfg.seed = o.seed;
  const int64_t batch = o.batch, seq = cfg.block_size;
  if (batch < 1) throw ValueError(str_cat("explain solve: --batch ", batch, " must be at least 1."));
  models::GPT gpt(cfg);
  auto one = std::make_shared<const mesh::DeviceMesh>(comm::rehearsal_group(1), std::vector<int64_t>{1},
                                                      std::vector<std::string>{"dp"});
  tensor::distribute_module(*gpt, one);
  torch::optim::AdamW opt(gpt->parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  const at::Tensor tokens = at::arange(batch * (seq + 1), at::kLong).view({batch, seq + 1}) * 7 % 256;
  // The inputs at the two batches the record is made at, made once, so that they can be named.
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> inputs;
  plan::NamedTensors named;
  for (int64_t b : {int64_t{1}, int64_t{2}}) {
    auto part = [&](int64_t from, int64_t to) {
      return tensor::from_local(tokens.slice(0, 0, b).slice(1, from, to).contiguous(), one,
                                {tensor::Replicate()});
    };
    inputs[b] = {part(0, seq), part(1, seq + 1)};
    named.emplace_back("tokens", inputs[b].first);
    named.emplace_back("targets", inputs[b].second);
  }
  auto step = [&](int64_t b) {
    opt.zero_grad();
    gpt->loss(inputs.at(b).first, inputs.at(b).second).backward();
    opt.step();
  };
  plan::NamedTensors params;
  for (const auto& p : gpt->named_parameters()) params.emplace_back(p.key(), p.value());
  plan::init_optimizer_state(opt);  // (named, so that a plan may place it: "<param>:exp_avg")
  named.insert(named.end(), params.begin(), params.end());
  for (auto& v : plan::optimizer_state(opt, params)) named.push_back(v);
  const int axes = static_cast<int>(s.mesh.size());
  if (s.batch_axis >= axes) {
    throw ValueError(str_cat("explain solve: --batch-axis ", s.batch_axis, " is not an axis of the ", axes,
                             "-axis mesh: give 0 to ", axes - 1, "."));
  }
  const comm::CostModel comm = s.profile.empty()
                                   ? comm::CostModel::defaults(axes)
                                   : comm::CostModel::from_profile(comm::read_profile(s.profile), axes);
  plan::SolveStepOptions so;
  so.mesh_shape = s.mesh;
  so.small = 1;
  so.budget = s.budget;
  so.pins = s.pins;
  so.batch_inputs = {"tokens", "targets"};
  so.batch_axis = s.batch_axis;
  const plan::SolvedStep solved = plan::solve_step(step, batch, named, comm, so, nullptr);
  const plan::StepRecord& record = solved.record;
  plan::StepGraph g = solved.graph;  // (re-solved under --compare-budget)
  const plan::SolverSolution& first = solved.solution;
  const double record_s = solved.record_s, graph_s = solved.graph_s, solve_s = solved.solve_s;
  std::string mesh_text;
  for (int64_t m : s.mesh) mesh_text += str_cat(mesh_text.empty() ? "" : "x", m);
  std::string out =
      str_cat("GPT ", cfg.n_layer, "x", cfg.n_embd, ", ", cfg.n_head, " heads, seq ", seq, ", batch ", batch,
              ", AdamW, on a ", mesh_text, " mesh: ", record.ops.size(), " ops recorded in ",
              std::to_string(record_s).substr(0, 4), " s (batches 1 and 2, scaled), graph in ",
              std::to_string(graph_s).substr(0, 4), " s, solved in ", std::to_string(solve_s).substr(0, 4),
              " s\n", "cost model: ",
              s.profile.empty() ? "built-in defaults (loopback TCP figures; --profile FILE for measured ones)"
                                : s.profile,
              "\n", plan::explain_solution(record, g, first, comm));
  if (s.compare_budget > 0) {
    g.problem.memory_budget = s.compare_budget;
    const plan::SolverSolution second = plan::solve_sharding(g.problem);
    out += str_cat("\n", plan::diff_solutions(record, g, first, second,
                                              s.budget > 0 ? "budget " + mib(s.budget) : "no budget",
                                              "budget " + mib(s.compare_budget), comm));
  }
  return out;
}

}  // namespace dtrain::train
