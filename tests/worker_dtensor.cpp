// The DTensor suites of the process tier (see worker_suites.h): every result against plain libtorch on whole
// tensors, with integer-valued data so that equality is exact wherever the summation order does not matter.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <unistd.h>
#include <cstdio>
#include <string>

#include "comm/comm_log.h"
#include "comm/cost_model.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/distribute_module.h"
#include "tensor/redistribute.h"
#include "tensor/settings.h"
#include "tensor/shard_math.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

using comm::ReduceOp;

namespace {

// Every source -> target pair: the executor's result equals the plain tensor's block, and the collectives it
// issued are the plan's, in kind and number.
void check_all_pairs(const mesh::DeviceMesh& m, const std::vector<tensor::Placement>& options) {
  using namespace dtrain::tensor;
  const std::vector<int64_t> shape{7, 5};
  at::Tensor g = (at::arange(35, at::kLong).view({7, 5}) * 3 % 17 - 8).to(at::kDouble);
  std::vector<Placements> all = all_placements(options, m.ndim());
  PlanCache cache(CostModel::defaults(m.ndim()));
  Placements replicated(m.ndim(), Replicate());
  // Partial(sum) with Partial(max): no single value, refused at the API (mixed_partials).
  auto mixes_partials = [](const Placements& p) { return !mixed_partials(p).empty(); };
  for (const Placements& from : all) {
    if (mixes_partials(from)) continue;
    for (const Placements& to : all) {
      if (mixes_partials(to)) continue;
      const RedistributePlan& plan = *cache.get({shape, 8, m.shape(), from, to});
      std::vector<IssuedCollective> issued;
      at::Tensor out = run_redistribute(block_of(g, m, from), m, plan, &issued);
      std::string what =
          str_cat("redistribute ", to_string(from), " -> ", to_string(to), " on ", m.to_string());
      ++g_checks;
      std::vector<StepKind> planned, ran;
      for (auto& s : plan.steps) {
        if (is_collective(s.kind) && m.size(s.axis) > 1) planned.push_back(s.kind);  // size 1: nothing moves
      }
      for (auto& c : issued) ran.push_back(c.kind);
      if (planned != ran) g_failures += str_cat("FAIL ", what, ": issued collectives differ from the plan\n");
      bool has_partial = std::any_of(to.begin(), to.end(), [](const Placement& p) { return p.is_partial(); });
      if (!has_partial) {
        check_equal(what, out, local_block(g, m.shape(), to, m.coordinate()));
      } else {  // a Partial result is checked through its reduction
        at::Tensor full = run_redistribute(out, m, *cache.get({shape, 8, m.shape(), to, replicated}));
        check_equal(what + " (reduced)", full, g);
      }
    }
  }
}

}  // namespace

void suite_redistribute(const comm::BackendPtr& world) {
  using tensor::Partial;
  using tensor::Replicate;
  using tensor::Shard;
  const int ws = world->group_size();
  mesh::DeviceMesh line(world, {ws}, {"x"});
  check_all_pairs(line, {Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum), Partial(ReduceOp::kAvg),
                         Partial(ReduceOp::kMax), Partial(ReduceOp::kMin)});
  if (ws == 2) {  // a 2-d mesh with a size-1 axis: steps on it are relabellings
    mesh::DeviceMesh tall(world, {2, 1}, {"dp", "tp"});
    check_all_pairs(tall, {Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum)});
  }
  if (ws == 4) {
    mesh::DeviceMesh square(world, {2, 2}, {"dp", "tp"});
    check_all_pairs(square, {Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum),
                             Partial(ReduceOp::kAvg), Partial(ReduceOp::kMax), Partial(ReduceOp::kMin)});
  }
  world->barrier()->wait();
}

// DTensor end to end on real collectives: creation and gathering, uneven shapes, pointwise ops that stay
// sharded, ops without a rule that gather (and strict mode), in-place ops, and an nn::Linear + AdamW step
// with replicated DTensor parameters equal to the same step on plain tensors.
void suite_dtensor(const comm::BackendPtr& world) {
  using namespace dtrain::tensor;
  const int ws = world->group_size();
  auto mesh = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{ws},
                                                       std::vector<std::string>{"x"});
  at::Tensor g = (at::arange(35, at::kLong).view({7, 5}) * 3 % 17 - 8).to(at::kDouble);
  at::Tensor h = (at::arange(35, at::kLong).view({7, 5}) * 5 % 13 - 6).to(at::kDouble);
  for (Placement p : {Shard(0), Shard(1), Replicate()}) {
    at::Tensor dt = distribute_tensor(g, mesh, {p});
    ++g_checks;
    if (!is_dtensor(dt) || dt.sizes() != g.sizes())
      g_failures += str_cat("FAIL distribute_tensor ", p.to_string(), "\n");
    check_equal(str_cat("to_local ", p.to_string()), to_local(dt),
                local_block(g, mesh->shape(), {p}, mesh->coordinate()));
    check_equal(str_cat("full_tensor ", p.to_string()), full_tensor(dt), g);
    DTensorSpec spec = spec_of(dt);
    ++g_checks;
    if (spec.shape != g.sizes().vec() || spec.placements != Placements{p} || spec.dtype != at::kDouble ||
        spec.local_chunk().shape != to_local(dt).sizes().vec()) {
      g_failures += str_cat("FAIL spec_of ", spec.to_string(), "\n");
    }
    at::Tensor again = from_local(to_local(dt).clone(), mesh, {p});  // global shape found from the blocks
    ++g_checks;
    if (again.sizes() != g.sizes()) g_failures += str_cat("FAIL from_local shape ", again.sizes(), "\n");
  }
  at::Tensor a = distribute_tensor(g, mesh, {Shard(0)});
  at::Tensor b = distribute_tensor(h, mesh, {Shard(0)});
  check_equal("redistribute S(0)->S(1)", to_local(redistribute(a, {Shard(1)})),
              local_block(g, mesh->shape(), {Shard(1)}, mesh->coordinate()));
  // The planner's cost model comes from DTRAIN_COMM_PROFILE when it names a profile: here one whose
  // all_gather takes a second per call.
  if (ws > 1) {
    std::string path = str_cat("/tmp/dtrain_profile_", getpid(), ".json");
    comm::CommProfile slow{"gloo", ws, {{"all_gather", comm::AlphaBeta{1.0, 1e-9}}}};
    comm::write_profile(path, slow);
    const DTensorSettings before = settings();
    double by_default = redistribute_plan(a, {Replicate()})->seconds;
    DTensorSettings with = before;
    with.comm_profile = path;
    set_settings(with);
    double by_profile = redistribute_plan(a, {Replicate()})->seconds;
    with.comm_profile = "/nonexistent/profile.json";
    set_settings(with);
    std::string error;
    try {
      redistribute_plan(a, {Replicate()});
    } catch (const ValueError& e) {
      error = e.what();
    }
    set_settings(before);
    std::remove(path.c_str());
    ++g_checks;
    if (!(by_default < 0.5 && by_profile >= 1.0) ||
        error.find("/nonexistent/profile.json") == std::string::npos) {
      g_failures += str_cat("FAIL DTRAIN_COMM_PROFILE: plan seconds ", by_default, " by default, ",
                            by_profile, " with the profile; bad path error: ", error, "\n");
    }
  }
  // Pointwise ops keep the shard layout (the gather fallback would return Replicate).
  at::Tensor c = a * b + a;
  ++g_checks;
  if (!is_dtensor(c) || placements_of(c) != Placements{Shard(0)})
    g_failures += "FAIL pointwise left Shard(0)\n";
  check_equal("pointwise a*b+a", full_tensor(c), g * h + g);
  a.add_(2);
  ++g_checks;
  if (placements_of(a) != Placements{Shard(0)}) g_failures += "FAIL in-place add_ changed placements\n";
  check_equal("in-place add_", full_tensor(a), g + 2);
  // mm by its rule: (S(0), R) -> S(0), no gathering.
  at::Tensor w = distribute_tensor(h.t().contiguous(), mesh, {Replicate()});
  int64_t gathers = tensor::detail::gather_count();
  at::Tensor m = at::mm(a, w);
  ++g_checks;
  if (placements_of(m) != Placements{Shard(0)} || tensor::detail::gather_count() != gathers) {
    g_failures += str_cat("FAIL mm (S(0), R) did not run by its rule: ", to_string(placements_of(m)), "\n");
  }
  check_equal("mm by rule", full_tensor(m), at::mm(g + 2, h.t()));
  // cumsum has no rule: gathered, correct, Replicate; strict mode refuses it.
  at::Tensor cs = at::cumsum(a, 0);
  check_equal("cumsum through the gather fallback", full_tensor(cs), at::cumsum(g + 2, 0));
  const DTensorSettings loose = settings();
  DTensorSettings strict = loose;
  strict.strict = true;
  set_settings(strict);
  ++g_checks;
  try {
    at::cumsum(a, 0);
    if (ws > 1) g_failures += "FAIL strict mode did not refuse cumsum\n";
  } catch (const NotSupportedError& e) {
    if (std::string(e.what()).find("aten::cumsum has no sharding rule") == std::string::npos) {
      g_failures += str_cat("FAIL strict message: ", e.what(), "\n");
    }
  }
  set_settings(loose);
  // Gradients flow through from_local, redistribute and to_local (each backward is its dual).
  {
    at::Tensor wfull = (at::arange(35, at::kDouble).view({7, 5}) % 4) - 1;
    for (Placement p : {Shard(0), Shard(1), Partial()}) {
      at::Tensor mine = block_of(g, *mesh, {p}).clone().requires_grad_(true);
      at::Tensor dt = from_local(mine, mesh, {p}, g.sizes().vec());
      at::Tensor y = to_local(redistribute(dt, {Replicate()}));  // the whole tensor on every rank
      (y * wfull).sum().backward();
      // d/d(block) of sum(whole * W): W's block for a shard; all of W for each part of a Partial(sum).
      at::Tensor want = p.is_partial() ? wfull : local_block(wfull, mesh->shape(), {p}, mesh->coordinate());
      check_equal(str_cat("gradient through from_local/redistribute/to_local ", p.to_string()), mine.grad(),
                  want);
    }
  }
  // nn::Linear + AdamW with replicated DTensor parameters equals the plain step.
  torch::manual_seed(0);
  torch::nn::Linear plain(5, 3);
  torch::nn::Linear dist(5, 3);
  {
    torch::NoGradGuard ng;
    dist->weight.copy_(plain->weight);
    dist->bias.copy_(plain->bias);
  }
  distribute_module(*dist, mesh);
  ++g_checks;
  if (!is_dtensor(dist->weight) || !is_dtensor(dist->parameters()[0]))
    g_failures += "FAIL distribute_module\n";
  at::Tensor x = (at::arange(20, at::kFloat).view({4, 5}) % 7 - 3) / 4;
  torch::optim::AdamW opt_plain(plain->parameters(), torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW opt_dist(dist->parameters(), torch::optim::AdamWOptions(0.01));
  for (int step = 0; step < 2; ++step) {
    opt_plain.zero_grad();
    opt_dist.zero_grad();
    at::Tensor loss_plain = torch::relu(plain->forward(x)).sum();
    at::Tensor loss_dist = torch::relu(dist->forward(distribute_tensor(x, mesh, {Replicate()}))).sum();
    loss_plain.backward();
    loss_dist.backward();
    check_equal(str_cat("linear loss step ", step), full_tensor(loss_dist), loss_plain.detach());
    check_equal(str_cat("linear weight grad step ", step), full_tensor(dist->weight.grad()),
                plain->weight.grad());
    opt_plain.step();
    opt_dist.step();
  }
  check_equal("linear weight after AdamW", full_tensor(dist->weight.detach()), plain->weight.detach());
  check_equal("linear bias after AdamW", full_tensor(dist->bias.detach()), plain->bias.detach());
  // Data parallel by the rules alone: batch Shard(0), parameters Replicate. The weight gradient comes out
  // Partial(sum) (each rank's rows), and AdamW's first op on it all-reduces it; no op gathers.
  torch::nn::Linear ref(5, 3), dp(5, 3);  // both start from plain's current weights, with fresh optimizers
  {
    torch::NoGradGuard ng;
    for (auto* mod : {&ref, &dp}) {
      (*mod)->weight.copy_(plain->weight);
      (*mod)->bias.copy_(plain->bias);
    }
  }
  distribute_module(*dp, mesh);
  torch::optim::AdamW opt_ref(ref->parameters(), torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW opt_dp(dp->parameters(), torch::optim::AdamWOptions(0.01));
  at::Tensor batch = (at::arange(35, at::kFloat).view({7, 5}) % 5 - 2) / 3;
  int64_t gathers_before_dp = tensor::detail::gather_count();
  comm::CommLog::instance().clear();
  at::Tensor lp = torch::relu(ref->forward(batch)).sum();
  at::Tensor ld = torch::relu(dp->forward(distribute_tensor(batch, mesh, {Shard(0)}))).sum();
  lp.backward();
  ld.backward();
  // The step's communication so far: the two Partial parameter gradients are all-reduced when AdamW first
  // combines them with the Replicate parameters (before that, nothing moves: forward and backward run on the
  // batch rows).
  comm::CommTotals totals = comm::CommLog::instance().totals();
  check_close("data parallel loss", full_tensor(ld), lp.detach());
  check_close("data parallel weight grad", full_tensor(dp->weight.grad()), ref->weight.grad());
  check_close("data parallel bias grad", full_tensor(dp->bias.grad()), ref->bias.grad());
  comm::CommLog::instance().clear();  // the checks above gathered for comparison
  opt_ref.step();
  opt_dp.step();
  comm::CommTotals after_step = comm::CommLog::instance().totals();
  // Forward and backward move nothing; the step all-reduces each Partial gradient exactly once (AdamW reads
  // it in three ops; the redistributed block is reused while the gradient is unchanged): 2 all_reduces, 15 +
  // 3 floats.
  ++g_checks;
  if (ws > 1 &&
      (totals.collectives != 0 || after_step.by_kind["all_reduce"] != 2 || after_step.collectives != 2 ||
       after_step.bytes != static_cast<int64_t>(18 * sizeof(float)))) {
    g_failures += str_cat("FAIL data parallel comm: ", totals.collectives,
                          " collectives before the step, then\n", comm::CommLog::instance().summary());
  }
  if (ws > 1 && world->group_rank() == 0) {
    std::fprintf(stderr, "data parallel step comm:\n%s", comm::CommLog::instance().summary().c_str());
  }
  check_close("data parallel weight after AdamW", full_tensor(dp->weight.detach()), ref->weight.detach());
  check_close("data parallel bias after AdamW", full_tensor(dp->bias.detach()), ref->bias.detach());
  ++g_checks;
  if (tensor::detail::gather_count() != gathers_before_dp) {
    g_failures +=
        str_cat("FAIL data parallel step gathered ", tensor::detail::gather_count() - gathers_before_dp,
                " times; every op should have run by a rule\n");
  }
  world->barrier()->wait();
}

}  // namespace dtrain::test
