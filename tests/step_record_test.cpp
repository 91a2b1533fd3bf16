// plan/step_record.h: one training step on DTensors recorded as a data-flow graph of aten ops.
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <set>

#include "comm/rehearsal.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "plan/step_graph.h"
#include "plan/step_plan.h"
#include "plan/step_record.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"
#include "tensor/follow_plan.h"
#include "tensor/op_choices.h"

namespace {

using dtrain::plan::record_step;
using dtrain::plan::StepRecord;

struct Mlp {
  torch::nn::Sequential net{torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3)};
  std::shared_ptr<const dtrain::mesh::DeviceMesh> mesh = std::make_shared<const dtrain::mesh::DeviceMesh>(
      dtrain::comm::rehearsal_group(1), std::vector<int64_t>{1}, std::vector<std::string>{"dp"});
  std::unique_ptr<torch::optim::SGD> opt;
  at::Tensor x, y;

  Mlp() {
    torch::manual_seed(0);
    dtrain::tensor::distribute_module(*net, mesh);
    opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    // (one rank: its block is the whole input)
    x = dtrain::tensor::from_local((at::arange(30, at::kFloat).view({5, 6}) % 7 - 3) / 4, mesh,
                                   {dtrain::tensor::Replicate()});
    y = dtrain::tensor::from_local((at::arange(15, at::kFloat).view({5, 3}) % 5 - 2) / 2, mesh,
                                   {dtrain::tensor::Replicate()});
  }
  void step() {
    opt->zero_grad();
    at::Tensor loss = (net->forward(x) - y).pow(2).mean();
    loss.backward();
    opt->step();
  }
};

std::vector<std::string> names(const StepRecord& r) {
  std::vector<std::string> n;
  for (const auto& op : r.ops) n.push_back(op.name);
  return n;
}

// Forward, backward and SGD's step: every value read was produced earlier in the step or came from outside it
// (parameters, momentum, inputs); the ops are the ones the module's math needs; the parameters are written in
// place once each; and a second step records the same ops.
TEST(StepRecord, OneStepOfAnMlpIsADataFlowGraphOfItsOps) {
  Mlp m;
  m.step();  // (the first step creates the momentum buffers; the steady step is the one to record)
  StepRecord r = record_step([&] { m.step(); });
  ASSERT_FALSE(r.ops.empty());
  for (size_t i = 0; i < r.ops.size(); ++i) {
    for (int v : r.ops[i].inputs) {
      ASSERT_LT(v, static_cast<int>(r.values.size()));
      EXPECT_LT(r.values[v].producer, static_cast<int>(i)) << r.ops[i].name << " reads a later value";
    }
    for (int v : r.ops[i].outputs) EXPECT_EQ(r.values[v].producer, static_cast<int>(i)) << r.ops[i].name;
  }
  auto count = r.op_counts();
  EXPECT_EQ(count["aten::addmm"], 2);               // the two layers' forward
  EXPECT_GE(count["aten::mm"], 3);                  // their weights' gradients and the hidden layer's input's
  EXPECT_EQ(count["aten::threshold_backward"], 1);  // ReLU's backward
  // From outside the step: each parameter and its momentum buffer (and the inputs).
  std::map<std::vector<int64_t>, int> outside;
  for (int v : r.outside_values()) ++outside[r.values[v].sizes];
  EXPECT_GE((outside[{8, 6}]), 2);
  EXPECT_GE((outside[{3, 8}]), 2);
  EXPECT_GE((outside[{8}]), 2);
  EXPECT_GE((outside[{5, 6}]), 1);
  // Each parameter gets its update in place: an aten::add_ whose output has its shape.
  std::map<std::vector<int64_t>, int> updated;
  for (const auto& op : r.ops) {
    if (op.name.rfind("aten::add_", 0) != 0) continue;
    for (int v : op.outputs) ++updated[r.values[v].sizes];
  }
  for (std::vector<int64_t> shape : {std::vector<int64_t>{8, 6}, {8}, {3, 8}, {3}}) {
    EXPECT_GE(updated[shape], 1) << "no in-place update of a parameter of shape " << shape.size() << "-d";
  }
  for (const auto& v : r.values) EXPECT_EQ(v.placements, "(R)");
  EXPECT_EQ(names(record_step([&] { m.step(); })), names(r));
}

// Recorded at batches 1 and 2 and scaled, the step at batch 5 is the step recorded at batch 5: the same ops,
// the same data flow, every value's shape.
TEST(StepRecord, TwoSmallBatchesScaleToTheStepAtAnyBatch) {
  Mlp small, full;
  auto at_batch = [](Mlp& m, int64_t b) {
    return [&m, b] {
      m.opt->zero_grad();
      auto slice = [&](const at::Tensor& t) {
        return dtrain::tensor::from_local(dtrain::tensor::to_local(t).slice(0, 0, b), m.mesh,
                                          {dtrain::tensor::Replicate()});
      };
      at::Tensor loss = (m.net->forward(slice(m.x)) - slice(m.y)).pow(2).mean();
      loss.backward();
      m.opt->step();
    };
  };
  StepRecord scaled =
      dtrain::plan::record_step_at([&](int64_t b) { at_batch(small, b)(); }, /*batch=*/5, /*small=*/1);
  at_batch(full, 5)();
  StepRecord want = record_step(at_batch(full, 5));
  EXPECT_EQ(names(scaled), names(want));
  ASSERT_EQ(scaled.values.size(), want.values.size());
  int grew = 0;
  for (size_t v = 0; v < want.values.size(); ++v) {
    EXPECT_EQ(scaled.values[v].sizes, want.values[v].sizes) << v;
    EXPECT_EQ(scaled.values[v].producer, want.values[v].producer) << v;
    grew += !want.values[v].sizes.empty() && want.values[v].sizes[0] == 5;
  }
  EXPECT_GE(grew, 4);  // (the inputs, the activations and their gradients)
  for (size_t i = 0; i < want.ops.size(); ++i) EXPECT_EQ(scaled.ops[i].inputs, want.ops[i].inputs);
  // A step whose ops depend on the batch cannot be scaled: the error names the op.
  try {
    dtrain::plan::record_step_at(
        [&](int64_t b) {
          at_batch(small, b)();
          if (b > 1) (void)(small.x * 2);
        },
        5);
    FAIL() << "no error";
  } catch (const dtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::mul"), std::string::npos) << e.what();
  }
}

// Recorded for a mesh shape, each op carries the ways its sharding rule lets it run there: a linear layer's
// addmm can split the batch (output S(0)), the features (S(1)) or run replicated, and a 2-d mesh multiplies
// the ways.
TEST(StepRecord, EachOpCarriesTheWaysItsRuleLetsItRunOnTheMeshToPlanFor) {
  Mlp m;
  m.step();
  StepRecord r = record_step([&] { m.step(); }, {2});
  int ruled = 0;
  std::set<std::string> addmm_outputs;
  for (const auto& op : r.ops) {
    if (!op.ruled) {
      EXPECT_TRUE(op.choices.empty()) << op.name;
      continue;
    }
    ++ruled;
    ASSERT_FALSE(op.choices.empty()) << op.name;
    for (const auto& c : op.choices) {
      ASSERT_EQ(c.inputs.size(), op.choice_inputs.size()) << op.name;
      for (const auto& p : c.inputs) EXPECT_EQ(p.size(), 1u) << op.name;
      if (op.name == "aten::addmm") addmm_outputs.insert(dtrain::tensor::to_string(c.outputs[0]));
    }
    for (int k : op.choice_inputs) EXPECT_LT(k, static_cast<int>(op.inputs.size())) << op.name;
  }
  EXPECT_EQ(ruled, static_cast<int>(r.ops.size()));  // (every op of this step has a rule)
  EXPECT_TRUE(addmm_outputs.count("(S(0))") && addmm_outputs.count("(S(1))") && addmm_outputs.count("(R)"))
      << addmm_outputs.size();
  // A 2-d mesh: one option per axis, so more ways for the same op.
  StepRecord r2 = record_step([&] { m.step(); }, {2, 2});
  ASSERT_EQ(r2.ops.size(), r.ops.size());
  for (size_t i = 0; i < r.ops.size(); ++i) {
    if (r.ops[i].name == "aten::addmm") {
      EXPECT_GT(r2.ops[i].choices.size(), r.ops[i].choices.size());
    }
  }
  // Without a mesh shape, none are recorded.
  for (const auto& op : record_step([&] { m.step(); }).ops) EXPECT_TRUE(op.choices.empty() && !op.ruled);
}

// A view that drops a leading size-1 dim keeps a shard: [1, 512] sharded on dim 1 views as [512] sharded on
// dim 0 (a bias's gradient, summed over the batch), with no gather between.
TEST(OpChoices, AViewDroppingASizeOneDimKeepsTheShard) {
  auto one = std::make_shared<const dtrain::mesh::DeviceMesh>(
      dtrain::comm::rehearsal_group(1), std::vector<int64_t>{1}, std::vector<std::string>{"dp"});
  const at::Tensor x = dtrain::tensor::from_local(at::ones({1, 10}), one, {dtrain::tensor::Replicate()});
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::view", "");
  for (const std::vector<int64_t>& to : {std::vector<int64_t>{10}, std::vector<int64_t>{1, 1, 10}}) {
    torch::jit::Stack args{c10::IValue(x), c10::IValue(to)};
    auto c = dtrain::tensor::op_choices(op, args, {3});
    ASSERT_TRUE(c.has_value());
    std::set<std::string> ways;
    for (const auto& ch : c->choices)
      ways.insert(dtrain::tensor::to_string(ch.inputs[0]) + "->" + dtrain::tensor::to_string(ch.outputs[0]));
    const std::string want = to.size() == 1 ? "(S(1))->(S(0))" : "(S(1))->(S(2))";
    EXPECT_TRUE(ways.count(want)) << want << " missing; " << ways.size() << " ways";
  }
}

// The index of the option of solver node `n` that keeps everything replicated.
int replicated_option(const dtrain::plan::StepGraph& g, const StepRecord& r, size_t n) {
  auto all_r = [](const dtrain::tensor::Placements& p) {
    return std::all_of(p.begin(), p.end(), [](const auto& x) { return x.is_replicate(); });
  };
  if (g.op[n] < 0) {
    for (size_t o = 0; o < g.placements[n].size(); ++o) {
      if (all_r(g.placements[n][o])) return static_cast<int>(o);
    }
    return -1;
  }
  const auto& choices = r.ops[g.op[n]].choices;
  for (size_t o = 0; o < choices.size(); ++o) {
    const auto& c = choices[o];
    if (std::all_of(c.inputs.begin(), c.inputs.end(), all_r) &&
        std::all_of(c.outputs.begin(), c.outputs.end(), all_r))
      return static_cast<int>(o);
  }
  return -1;
}

// The MLP's step as the solver's graph on two ranks: a node per op and per outside value; everything
// replicated costs the recorded ops' time, moves nothing and holds the replicated step's peak; the solver
// does at least as well, and under a budget below that peak it shards and fits.
TEST(StepGraph, TheMlpsStepOnTwoRanksReplicatedOrShardedUnderABudget) {
  Mlp m;
  m.step();
  StepRecord r = record_step([&] { m.step(); }, {2});
  const auto comm = dtrain::comm::CostModel::defaults(1);
  dtrain::plan::StepGraph g = dtrain::plan::build_step_graph(r, {2}, comm);
  ASSERT_EQ(g.problem.nodes.size(), r.ops.size() + r.outside_values().size());
  std::vector<int> rep;
  double op_seconds = 0;
  for (size_t n = 0; n < g.problem.nodes.size(); ++n) {
    rep.push_back(replicated_option(g, r, n));
    ASSERT_GE(rep.back(), 0) << g.problem.nodes[n].name;
    if (g.op[n] >= 0) op_seconds += r.ops[g.op[n]].seconds;
  }
  EXPECT_NEAR(dtrain::plan::solution_time(g.problem, rep), op_seconds, 1e-12);
  EXPECT_NEAR(dtrain::plan::solution_memory(g.problem, rep), g.replicated_bytes, 1e-6 * g.replicated_bytes);
  EXPECT_GT(g.replicated_bytes, 0);
  dtrain::plan::SolverSolution free = dtrain::plan::solve_sharding(g.problem);
  EXPECT_LE(free.time_s, op_seconds + 1e-12);
  g.problem.memory_budget = 0.7 * g.replicated_bytes;
  dtrain::plan::SolverSolution tight = dtrain::plan::solve_sharding(g.problem);
  EXPECT_LE(tight.memory, g.problem.memory_budget);
  int sharded = 0;
  for (size_t n = 0; n < g.problem.nodes.size(); ++n) sharded += tight.choice[n] != rep[n];
  EXPECT_GT(sharded, 0);
  EXPECT_GE(tight.time_s, free.time_s);
  // A pinned parameter keeps its placements under the budget; an unknown name or placement is an error.
  dtrain::plan::NamedTensors names;
  for (const auto& p : m.net->named_parameters()) names.emplace_back(p.key(), p.value());
  StepRecord named = record_step([&] { m.step(); }, {2}, names);
  dtrain::plan::StepGraph pinned = dtrain::plan::build_step_graph(named, {2}, comm, 0.7 * g.replicated_bytes);
  dtrain::plan::pin_value(pinned, named, "0.weight", {dtrain::tensor::Replicate()});
  dtrain::plan::pin_value(pinned, named, "2.weight", {dtrain::tensor::Shard(0)});
  dtrain::plan::SolverSolution kept = dtrain::plan::solve_sharding(pinned.problem);
  int seen = 0;
  for (size_t n = 0; n < pinned.problem.nodes.size(); ++n) {
    if (pinned.value[n] < 0) continue;
    const std::string& name = named.values[pinned.value[n]].name;
    if (name == "0.weight" || name == "2.weight") {
      ++seen;
      EXPECT_EQ(dtrain::tensor::to_string(pinned.placements[n][kept.choice[n]]),
                name == "0.weight" ? "(R)" : "(S(0))");
    }
  }
  EXPECT_EQ(seen, 2);
  EXPECT_THROW(dtrain::plan::pin_value(pinned, named, "9.weight", {dtrain::tensor::Replicate()}),
               dtrain::ValueError);
  EXPECT_THROW(dtrain::plan::pin_value(pinned, named, "0.weight", {dtrain::tensor::Shard(2)}),
               dtrain::ValueError);
  // A step recorded without the mesh shape has no choices: the error names the first op.
  try {
    dtrain::plan::build_step_graph(record_step([&] { m.step(); }), {2}, comm);
    FAIL() << "no error";
  } catch (const dtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("op #0 aten::"), std::string::npos) << e.what();
  }
}

// The GPT's training step (4 blocks, AdamW), recorded at batch 1 and 2 and scaled to 16, as the solver's
// graph on 4 ranks: every op has a rule, and under a budget below the replicated peak the solver fits it.
TEST(StepGraph, TheGptsStepOnFourRanks) {
  dtrain::models::GPTConfig c;
  c.n_layer = 4;
  c.n_embd = 128;
  c.n_head = 4;
  c.block_size = 64;
  dtrain::models::GPT gpt(c);
  auto mesh = std::make_shared<const dtrain::mesh::DeviceMesh>(
      dtrain::comm::rehearsal_group(1), std::vector<int64_t>{1}, std::vector<std::string>{"dp"});
  dtrain::tensor::distribute_module(*gpt, mesh);
  torch::optim::AdamW opt(gpt->parameters(), torch::optim::AdamWOptions(1e-3));
  const at::Tensor tokens = at::arange(16 * 65, at::kLong).view({16, 65}) * 7 % 256;
  auto step = [&](int64_t b) {
    auto part = [&](int64_t from, int64_t to) {
      return dtrain::tensor::from_local(tokens.slice(0, 0, b).slice(1, from, to).contiguous(), mesh,
                                        {dtrain::tensor::Replicate()});
    };
    opt.zero_grad();
    gpt->loss(part(0, 64), part(1, 65)).backward();
    opt.step();
  };
  const auto t0 = std::chrono::steady_clock::now();
  StepRecord r = dtrain::plan::record_step_at(step, 16, 1, {4});
  const double record_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::map<std::string, int> unruled;
  for (const auto& op : r.ops) {
    if (!op.ruled) ++unruled[op.name];
  }
  EXPECT_TRUE(unruled.empty()) << unruled.size() << " ops without a rule, e.g. " << unruled.begin()->first;
  if (!unruled.empty()) return;
  const auto t1 = std::chrono::steady_clock::now();
  dtrain::plan::StepGraph g = dtrain::plan::build_step_graph(r, {4}, dtrain::comm::CostModel::defaults(1));
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  g.problem.memory_budget = 0.5 * g.replicated_bytes;
  const auto t2 = std::chrono::steady_clock::now();
  dtrain::plan::SolverSolution s = dtrain::plan::solve_sharding(g.problem);
  const double solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count();
  EXPECT_LE(s.memory, g.problem.memory_budget);
  std::printf(
      "GPT 4x128 step: %zu ops, %zu values, %zu nodes, %zu edges; recorded in %.2f s, graph in %.2f s, "
      "solved in %.2f s (width %d, gap %.3g, %d eliminations); replicated peak %.1f MiB, plan %.1f MiB\n",
      r.ops.size(), r.values.size(), g.problem.nodes.size(), g.problem.edges.size(), record_s, build_s,
      solve_s, s.width, s.gap, s.solves, g.replicated_bytes / 1048576, s.memory / 1048576);
}

// Expects `f` to throw a ValueError whose message holds every one of `needles`.
template <class F>
void expect_value_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const dtrain::ValueError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// Following a solved plan: the steps that run the recorded ops pass; an op other than the plan's at its
// position, an op beyond the plan, a step that ends early and placements the rule does not allow are errors
// naming the position and the ops.
TEST(FollowPlan, RunsTheRecordedStepAndRefusesAnyOther) {
  Mlp m;
  m.step();
  StepRecord r = record_step([&] { m.step(); }, {1});
  dtrain::plan::StepGraph g = dtrain::plan::build_step_graph(r, {1}, dtrain::comm::CostModel::defaults(1));
  const dtrain::plan::StepPlan p =
      dtrain::plan::step_plan(r, g, dtrain::plan::solve_sharding(g.problem).choice);
  ASSERT_EQ(p.ops.size(), r.ops.size());
  {
    dtrain::tensor::FollowPlan follow(p.ops);
    m.step();
    follow.end_step();
    m.step();
    follow.end_step();
    EXPECT_EQ(follow.steps(), 2);
  }
  {
    dtrain::tensor::FollowPlan follow(p.ops);
    expect_value_error([&] { (void)(m.x * 2); }, {"op #0 of the step is aten::mul", p.ops[0].name});
  }
  {
    dtrain::tensor::FollowPlan follow(p.ops);
    m.step();
    expect_value_error([&] { (void)(m.x * 2); }, {"beyond the solved plan", "aten::mul"});
  }
  {
    dtrain::tensor::FollowPlan follow(p.ops);
    m.opt->zero_grad();
    (void)m.net->forward(m.x);
    expect_value_error([&] { follow.end_step(); }, {"the step ended after", "record and solve it again"});
  }
  {
    auto bad = p.ops;
    size_t k = 0;
    while (k < bad.size() && bad[k].name != "aten::addmm") ++k;
    ASSERT_LT(k, bad.size());
    bad[k].choice.outputs[0] = {dtrain::tensor::Shard(5)};
    dtrain::tensor::FollowPlan follow(bad);
    expect_value_error([&] { m.step(); },
                       {"op #" + std::to_string(k) + " aten::addmm", "S(5)", "does not allow"});
  }
  // Without a plan the handler chooses by itself again.
  m.step();
}

TEST(StepRecord, AStepWithoutDTensorsIsAnError) {
  at::Tensor a = at::ones({2, 2});
  try {
    record_step([&] { (void)(a * 2).sum(); });
    FAIL() << "no error";
  } catch (const dtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("distribute_module"), std::string::npos) << e.what();
  }
}

}  // namespace
