// The solved-step suite (see worker_suites.h): a module's training step recorded on one rank, solved for the
// world's mesh under a memory budget, and run by the plan (tensor::FollowPlan) on real ranks, step after step
// equal to the same module trained on plain tensors in this process.
#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "comm/comm_log.h"
#include "comm/cost_model.h"
#include "comm/rehearsal.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "plan/optimizer_state.h"
#include "plan/step_graph.h"
#include "plan/step_plan.h"
#include "plan/step_record.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"
#include "tensor/follow_plan.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

using namespace dtrain::tensor;
using ModulePtr = std::shared_ptr<torch::nn::Module>;

// A module, its loss on two inputs, and the inputs (the whole batch; a step at b samples takes the first b).
struct Case {
  std::string name;
  std::function<ModulePtr()> make;  // the same values at every call, float64
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&, const at::Tensor&)> loss;
  at::Tensor a, b;
  std::string a_name, b_name;
  double lr = 1e-2;
};

plan::NamedTensors named_parameters(torch::nn::Module& m) {
  plan::NamedTensors out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

torch::optim::AdamWOptions adamw(double lr) {
  return torch::optim::AdamWOptions(lr).weight_decay(0.1).eps(1e-3);  // (eps: see worker_gpt.cpp)
}

void check_case(const comm::BackendPtr& world, const Case& c, const std::vector<int64_t>& mesh_shape,
                const std::vector<std::string>& axes, int steps) {
  int ws = 1;
  for (int64_t m : mesh_shape) ws *= static_cast<int>(m);
  const int64_t batch = c.a.size(0);
  std::string mesh_text;
  for (int64_t m : mesh_shape) mesh_text += str_cat(mesh_text.empty() ? "" : "x", m);
  const std::string what = str_cat(c.name, " solved on ", mesh_text);

  // Record the step on one rank, as its own process would, on a copy of the module.
  auto one = std::make_shared<const mesh::DeviceMesh>(comm::rehearsal_group(1), std::vector<int64_t>{1},
                                                      std::vector<std::string>{"dp"});
  ModulePtr rec = c.make();
  distribute_module(*rec, one);
  torch::optim::AdamW opt_rec(rec->parameters(), adamw(c.lr));
  plan::init_optimizer_state(opt_rec);
  plan::NamedTensors named = named_parameters(*rec);
  for (auto& s : plan::optimizer_state(opt_rec, named_parameters(*rec))) named.push_back(s);
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> inputs;
  for (int64_t b : {int64_t{1}, int64_t{2}}) {
    inputs[b] = {from_local(c.a.slice(0, 0, b).contiguous(), one, {Replicate()}),
                 from_local(c.b.slice(0, 0, b).contiguous(), one, {Replicate()})};
    named.emplace_back(c.a_name, inputs[b].first);
    named.emplace_back(c.b_name, inputs[b].second);
  }
  plan::StepRecord r = plan::record_step_at(
      [&](int64_t b) {
        opt_rec.zero_grad();
        c.loss(*rec, inputs.at(b).first, inputs.at(b).second).backward();
        opt_rec.step();
      },
      batch, 1, mesh_shape, named);
  plan::share_op_times(r, *world);  // (every rank solves the same problem)
  // Solved under a budget below the replicated step's peak (one rank: none).
  plan::StepGraph g = plan::build_step_graph(r, mesh_shape, comm::CostModel::defaults(mesh_shape.size()));
  if (ws > 1) g.problem.memory_budget = (0.5 + 0.5 / ws) * g.replicated_bytes;
  plan::SolverOptions limits;
  limits.time_limit_s = 1;  // (a plan within a few percent of the best is as good a test)
  plan::SolverSolution sol = plan::solve_sharding(g.problem, limits);
  plan::share_choice(sol.choice, *world);  // (rank 0's plan, wherever the solver's time limit fell)
  const plan::StepPlan p = plan::step_plan(r, g, sol.choice);
  int sharded = 0;
  for (const auto& op : p.ops) {
    for (const auto& out : op.choice.outputs)
      sharded += !std::all_of(out.begin(), out.end(), [](const auto& x) { return x.is_replicate(); });
  }
  check_true(str_cat(what, ": a plan for every recorded op (", p.ops.size(), " of ", r.ops.size(), ")"),
             p.ops.size() == r.ops.size());
  if (ws > 1)
    check_true(str_cat(what, ": the plan shards under the budget (", sharded, " ops)"), sharded > 0);

  // Run it on the world's mesh by the plan, against one process.
  auto mesh = std::make_shared<const mesh::DeviceMesh>(world, mesh_shape, axes);
  ModulePtr ref = c.make(), dist = c.make();
  distribute_module(*dist, mesh);
  torch::optim::AdamW opt_ref(ref->parameters(), adamw(c.lr));
  torch::optim::AdamW opt_dist(dist->parameters(), adamw(c.lr));
  plan::init_optimizer_state(opt_dist);
  plan::NamedTensors values = named_parameters(*dist);
  for (auto& s : plan::optimizer_state(opt_dist, named_parameters(*dist))) values.push_back(s);
  const int placed = plan::place_values(p, values);
  check_true(
      str_cat(what, ": every parameter and its AdamW state placed (", placed, " of ", values.size(), ")"),
      placed == static_cast<int>(values.size()));
  const int64_t gathers = detail::gather_count();
  comm::CommLog::instance().clear();
  int followed = 0;
  for (int s = 1; s <= steps; ++s) {
    opt_ref.zero_grad();
    at::Tensor loss_ref = c.loss(*ref, c.a, c.b);
    loss_ref.backward();
    opt_ref.step();
    const at::Tensor a = distribute_tensor(c.a, mesh, p.placements(c.a_name));
    const at::Tensor b = distribute_tensor(c.b, mesh, p.placements(c.b_name));
    opt_dist.zero_grad();
    at::Tensor loss;
    {
      FollowPlan follow(p.ops);
      loss = c.loss(*dist, a, b);
      loss.backward();
      opt_dist.step();
      follow.end_step();
      followed += static_cast<int>(follow.steps());
    }
    check_close(str_cat(what, " step ", s, " loss"), full_tensor(loss.detach()), loss_ref.detach(), 1e-10);
  }
  auto pd = dist->named_parameters();
  for (const auto& q : ref->named_parameters()) {
    check_close(str_cat(what, " after ", steps, " steps ", q.key()), full_tensor(pd[q.key()].detach()),
                q.value().detach(), 1e-10);
  }
  check_true(str_cat(what, ": ", followed, " steps followed"), followed == steps);
  check_true(str_cat(what, ": no op gathered"), detail::gather_count() == gathers);
  if (world->group_rank() == 0) {
    std::fprintf(stderr, "%s: %zu ops, %d sharded outputs, solver gap %.3g; %s", what.c_str(), p.ops.size(),
                 sharded, sol.gap, comm::CommLog::instance().summary().c_str());
  }
}

Case mlp_case() {
  Case c;
  c.name = "MLP 6-16-5";
  c.make = [] {
    torch::manual_seed(3);
    auto net = torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 5));
    net->to(at::kDouble);
    return net.ptr();
  };
  c.loss = [](torch::nn::Module& m, const at::Tensor& x, const at::Tensor& y) {
    return (dynamic_cast<torch::nn::SequentialImpl&>(m).forward(x) - y).pow(2).mean();
  };
  c.a = data({7, 6}, 1);  // (7 samples: uneven on 2, 3 and 4 ranks)
  c.b = data({7, 5}, 2);
  c.a_name = "x";
  c.b_name = "y";
  return c;
}

Case gpt_case() {
  models::GPTConfig cfg;
  cfg.vocab_size = 67;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 32;
  Case c;
  c.name = "GPT 2x32";
  c.make = [cfg] {
    models::GPT g(cfg);
    g->to(at::kDouble);
    return g.ptr();
  };
  c.loss = [](torch::nn::Module& m, const at::Tensor& idx, const at::Tensor& targets) {
    return dynamic_cast<models::GPTImpl&>(m).loss(idx, targets);
  };
  at::Tensor tokens = ((at::arange(6 * 9, at::kLong) * 7 + 3) % cfg.vocab_size).view({6, 9});
  c.a = tokens.narrow(1, 0, 8).contiguous();
  c.b = tokens.narrow(1, 1, 8).contiguous();
  c.a_name = "tokens";
  c.b_name = "targets";
  c.lr = 3e-3;
  return c;
}

}  // namespace

void suite_solved(const comm::BackendPtr& world) {
  const int64_t ws = world->group_size();
  check_case(world, mlp_case(), {ws}, {"dp"}, 4);
  check_case(world, gpt_case(), {ws}, {"dp"}, 3);
  world->barrier()->wait();
}

}  // namespace dtrain::test
