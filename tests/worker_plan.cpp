// The planner from C++ for a module written here (tests/worker_suites.h, suite_plan_module): not the GPT,
// with a tensor-parallel plan of its own. plan::plan_module measures its compute on these ranks and plans;
// train::apply_plan runs the chosen candidate (and, at an even world, the fastest tensor-parallel one) with
// the Trainer, whose loss at every step equals plain libtorch's AdamW on one process over the same batches.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdlib>

#include "core/error.h"
#include "plan/plan_module.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"
#include "train/apply_plan.h"
#include "train/trainer.h"

namespace dtrain::test {

namespace {

constexpr int64_t kWidth = 16, kBatch = 12, kSteps = 4;

// Two residual MLP blocks on [N, C] rows: up (colwise under tp), relu, down (rowwise).
struct PlannedNetImpl : torch::nn::Module {
  PlannedNetImpl() {
    for (int b = 0; b < 2; ++b) {
      up.push_back(register_module(str_cat("up", b), torch::nn::Linear(kWidth, 4 * kWidth)));
      down.push_back(register_module(str_cat("down", b), torch::nn::Linear(4 * kWidth, kWidth)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t b = 0; b < up.size(); ++b) x = x + down[b](at::relu(up[b](x)));
    return x;
  }
  std::vector<torch::nn::Linear> up, down;
};
TORCH_MODULE(PlannedNet);

std::shared_ptr<torch::nn::Module> build() {
  at::manual_seed(7);  // (the same weights in every copy: the reference's and each trained one's)
  return PlannedNet().ptr();
}

at::Tensor mse(PlannedNetImpl& net, const at::Tensor& x, const at::Tensor& y) {
  return (net.forward(x) - y).pow(2).mean();
}

// Step s's global batch: inputs and targets, integer-valued draws scaled down (the same on every rank).
std::vector<at::Tensor> batch_of(int64_t step) {
  at::Generator g = at::detail::createCPUGenerator(1000 + static_cast<uint64_t>(step));
  return {at::randint(-4, 5, {kBatch, kWidth}, g, at::kFloat) / 4,
          at::randint(-4, 5, {kBatch, kWidth}, g, at::kFloat) / 4};
}

plan::ProfileTarget target() {
  plan::ProfileTarget t;
  t.description = "test MLP 2 blocks x 16";
  t.build = build;
  t.loss = [](torch::nn::Module& m, int64_t mb) {
    return mse(dynamic_cast<PlannedNetImpl&>(m), at::randn({mb, kWidth}), at::randn({mb, kWidth}));
  };
  t.tp_plan = [](bool sp) {
    parallel::TensorParallelPlan p{
        {{"up*", parallel::ColwiseParallel()}, {"down*", parallel::RowwiseParallel()}}, sp};
    return p;
  };
  return t;
}

// Trains `c` for kSteps with the Trainer and checks each step's loss against one process's AdamW.
void train_candidate(const comm::BackendPtr& world, const plan::Candidate& c, const plan::ProfileTarget& t) {
  train::TrainerOptions o;
  o.batch = kBatch;
  o.steps = kSteps;
  o.log_every = 1000;
  train::apply_plan(o, c, t);
  auto model = std::dynamic_pointer_cast<PlannedNetImpl>(build());
  std::vector<double> losses;
  struct Losses : train::Callback {
    std::vector<double>* out;
    bool wants_loss(int64_t) override { return true; }
    void on_step_end(train::Trainer&, const train::StepInfo& s) override { out->push_back(s.loss); }
  };
  {
    train::Trainer trainer(
        *model, [&](const train::Trainer::Batch& rows) { return mse(*model, rows[0], rows[1]); }, batch_of, o,
        world);
    auto cb = std::make_shared<Losses>();
    cb->out = &losses;
    trainer.add_callback(cb);
    trainer.fit();
  }
  auto ref = std::dynamic_pointer_cast<PlannedNetImpl>(build());
  torch::optim::AdamW opt(
      ref->parameters(),
      torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay).betas({o.beta1, o.beta2}).eps(o.eps));
  check_true(str_cat(c.name(), ": ", kSteps, " losses (got ", losses.size(), ")"),
             static_cast<int64_t>(losses.size()) == kSteps);
  for (int64_t s = 1; s <= kSteps && s <= static_cast<int64_t>(losses.size()); ++s) {
    const auto b = batch_of(s);
    opt.zero_grad();
    at::Tensor loss = mse(*ref, b[0], b[1]);
    loss.backward();
    opt.step();
    const double want = loss.item<double>();
    check_true(str_cat(
                   c.name(), " (flags:",
                   [&] {
                     std::string f;
                     for (const auto& x : c.flags) f += " " + x;
                     return f;
                   }(),
                   ") step ", s, ": loss ", losses[s - 1], " against one process's ", want),
               std::abs(losses[s - 1] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
  }
}

}  // namespace

void suite_plan_module(const comm::BackendPtr& world, const std::string& dir) {
  ::setenv("DTRAIN_CACHE_DIR", (dir + "/cache").c_str(), 1);  // (the same folder for every rank)
  const int64_t n = world->group_size();
  plan::ModulePlanRequest r;
  r.target = target();
  r.tp_degrees = {2, 4};
  r.batch = kBatch;
  r.profile = "builtin";  // (the links' measurement is the GPT's process test's; here the module's compute)
  r.world = n;
  r.ranks_per_host = n;
  r.group = world;
  const plan::ModulePlan p = plan::plan_module(r);
  check_true(str_cat("a plan of ", p.plan.candidates.size(), " candidates"), !p.plan.candidates.empty());
  const plan::Candidate& chosen = p.plan.candidates[p.plan.chosen];
  check_true(str_cat("the chosen ", chosen.name(), " fits and ranks first"), chosen.fits && chosen.rank == 1);
  // the module's own plan splits its matrices: those parameters hold 1/tp per rank
  int split = 0;
  for (const auto& f : p.facts.params) split += f.tp_placement != "Replicate()" ? 1 : 0;
  check_true(str_cat("4 split weights and 2 split biases of the up layers (got ", split, ")"), split == 6);
  const plan::Candidate* tp = nullptr;
  for (const auto& c : p.plan.candidates) {
    check_true(str_cat(c.name(), ": a positive prediction"),
               c.predicted_step_s > 0 && c.predicted_peak_bytes > 0);
    if (c.tp > 1 && c.fits && (!tp || c.rank < tp->rank)) tp = &c;
  }
  check_true(str_cat("tensor-parallel candidates at ", n, " ranks"), (n % 2 == 0) == (tp != nullptr));
  train_candidate(world, chosen, r.target);
  if (tp && tp != &chosen) train_candidate(world, *tp, r.target);
  // a candidate needing what the target lacks is refused, naming it
  plan::ProfileTarget bare = r.target;
  bare.tp_plan = nullptr;
  plan::Candidate c = chosen;
  c.tp = 2;
  train::TrainerOptions o;
  try {
    train::apply_plan(o, c, bare);
    check_true("apply_plan refuses tp 2 without a tp plan", false);
  } catch (const ValueError& e) {
    check_true(str_cat("the refusal names the plan: ", e.what()),
               std::string(e.what()).find("tensor-parallel plan") != std::string::npos);
  }
}

}  // namespace dtrain::test
