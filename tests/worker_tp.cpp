// The tensor-parallel suites (see worker_suites.h): models::GPT and a module written here laid out by
// parallel::parallelize with tp > 1, against the same model trained on the whole batch in this process with
// plain libtorch; the collectives of each style from CommLog; the plan's errors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <string>

#include "apps/dtrain/gpt/train_gpt.h"
#include "comm/comm_log.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "models/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/parallelize.h"
#include "tests/parity_loop.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

template <typename F>
void check_throws(const std::string& what, F&& f, const std::string& needle) {
  ++g_checks;
  try {
    f();
    g_failures += str_cat("FAIL ", what, ": no error\n");
  } catch (const std::exception& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      g_failures += str_cat("FAIL ", what, ": message '", e.what(), "' lacks '", needle, "'\n");
    }
  }
}

// Heads that do not divide the degree: 3 heads on 2 ranks (2 + 1), 5 on 3 (2 + 2 + 1) and on 4 (2 + 1 + 1 +
// 1).
models::GPTConfig tp_gpt(int64_t tp) {
  models::GPTConfig c;
  c.vocab_size = 64;  // split 22 + 21 + 21 on 3 ranks
  c.block_size = 16;  // the sequence split 6 + 5 + 5 under sequence parallel
  c.n_layer = 2;
  c.n_head = tp == 2 ? 3 : 5;
  c.n_embd = c.n_head * 8;
  c.seed = 11;
  return c;
}

// This rank's part of the whole tensor `whole` as the layout keeps it for parameter `name`.
at::Tensor part(parallel::Parallelized& par, const std::string& name, const at::Tensor& whole) {
  const auto p = par.tensor_parallel()->part_of(name);
  return p.count < 0 ? whole : whole.narrow(p.dim, p.start, p.count);
}

int64_t count_prefix(const std::map<std::string, int64_t>& by_cause, const std::string& prefix) {
  int64_t n = 0;
  for (const auto& [cause, k] : by_cause) {
    if (cause.rfind(prefix, 0) == 0) n += k;
  }
  return n;
}

// The collectives of one pass (forward or backward) against the styles' budget: per block, one all-reduce
// (or under sequence parallel one all-gather and one reduce-scatter); the vocabulary-parallel embedding and
// head as many; the loss-parallel cross entropy two all-reduces in forward.
void check_pass_comm(const std::string& tag, const models::GPTConfig& cfg, bool sp, bool forward) {
  const auto c = comm::CommLog::instance().totals();
  const auto records = comm::CommLog::instance().records();
  auto kinds_of = [&](const std::string& prefix) {
    std::map<std::string, int64_t> k;
    for (const auto& r : records) {
      if (r.cause.rfind(prefix, 0) == 0) ++k[comm::to_string(r.kind)];
    }
    return k;
  };
  const std::map<std::string, int64_t> block =
      sp ? std::map<std::string, int64_t>{{"all_gather", 1}, {"reduce_scatter", 1}}
         : std::map<std::string, int64_t>{{"all_reduce", 1}};
  int64_t expected = 0;
  for (int64_t b = 0; b < cfg.n_layer; ++b) {
    for (const char* part : {".attn.", ".mlp."}) {
      const std::string prefix = str_cat("h", b, part);
      const auto got = kinds_of(prefix);
      check_true(str_cat(tag, forward ? "forward" : "backward", ": ", prefix, " issues ",
                         sp ? "one all-gather and one reduce-scatter" : "one all-reduce", " (got ",
                         count_prefix(c.by_cause, prefix), ")"),
                 got == block);
      expected += sp ? 2 : 1;
    }
  }
  // The embedding (forward: its sum; backward: nothing, or the all-gather under SP) and the tied head
  // (forward: nothing, or its input's all-gather; backward: its input's gradient), plus the loss.
  const auto wte = kinds_of("wte");
  const int64_t wte_n = count_prefix(c.by_cause, "wte");
  const int64_t wte_expected = (sp ? 2 : 1) + (forward ? 2 : 0);
  check_true(str_cat(tag, forward ? "forward" : "backward", ": the embedding, head and loss issue ",
                     wte_expected, " (got ", wte_n, ")"),
             wte_n == wte_expected);
  expected += wte_expected;
  check_true(str_cat(tag, forward ? "forward" : "backward", ": ", expected, " collectives in all (got ",
                     c.collectives, ")"),
             c.collectives == expected);
}

// 20 AdamW steps of a small GPT in float64 under `strategy` × tp, accumulation `acc`, against one process.
// `mesh_order` ("tp,dp": the tp groups strided, ranks {0, 2} and {1, 3} on 4) as ParallelConfig's.
void check_gpt(const comm::BackendPtr& world, const std::string& strategy, int64_t tp, bool sp, int64_t acc,
               const std::vector<std::string>& mesh_order = {}) {
  const std::string tag = str_cat(strategy, " x tp ", tp, sp ? " + sequence parallel" : "", " accumulation ",
                                  acc, mesh_order.empty() ? "" : " mesh tp,dp", ": ");
  const models::GPTConfig cfg = tp_gpt(tp);
  const int64_t B = 8, steps = 20;
  const int64_t ndp = world->group_size() / tp;
  auto [ref, gpt] = twin_gpts(cfg, at::kDouble);
  const auto adamw = parity_adamw;
  auto ref_opt = adamw(ref->parameters());
  parallel::ParallelConfig pc;
  pc.strategy = strategy;
  pc.tp = tp;
  pc.tp_plan = train::gpt_tensor_parallel_plan(cfg, sp);
  pc.mesh_order = mesh_order;
  auto par = parallel::parallelize(*gpt, world, pc, adamw);
  const int64_t dp_rank = par->data_parallel_group()->group_rank();
  const int64_t tp_rank = par->mesh() ? par->mesh()->axis_group("tp")->group_rank() : 0;
  const int64_t me = world->group_rank();
  check_true(
      str_cat(tag, "rank ", me, " is tp rank ", tp_rank, " and dp rank ", dp_rank, " of the mesh's order"),
      mesh_order.empty() ? dp_rank == me / tp && tp_rank == me % tp
                         : dp_rank == me % ndp && tp_rank == me / ndp);
  const bool count_comm = strategy == "dp" && ndp == 1;
  ParityLoop loop;
  loop.tag = tag;
  loop.steps = steps;
  loop.accumulation = acc;
  loop.dp_size = ndp;
  loop.dp_rank = dp_rank;
  loop.tp = tp;
  loop.micro_batch = [&](int64_t step, int64_t k) {
    const Range micro = balanced_part(B, acc, k);
    return token_windows(B, cfg, 2000 + step).narrow(0, micro.start, micro.count);
  };
  loop.before_micro = [&](int64_t, int64_t) { comm::CommLog::instance().clear(); };
  loop.after_forward = [&](int64_t step, int64_t) {
    if (count_comm && step >= 2) check_pass_comm(str_cat(tag, "step ", step, " "), cfg, sp, true);
    comm::CommLog::instance().clear();
  };
  loop.after_backward = [&](int64_t step, int64_t) {
    if (count_comm && step >= 2) check_pass_comm(str_cat(tag, "step ", step, " "), cfg, sp, false);
  };
  loop.before_step = [&](int64_t) { comm::CommLog::instance().clear(); };
  loop.after_step = [&](int64_t step) {
    if (!count_comm) return;
    const auto c = comm::CommLog::instance().totals();
    check_true(str_cat(tag, "step ", step, ": the optimizer step issues ", sp ? 1 : 0,
                       " collectives (the sequence-parallel gradients; got ", c.collectives, ")"),
               c.collectives == (sp ? 1 : 0));
  };
  run_parity(world, ref, *ref_opt, gpt, side_of(*par), loop);
  auto mine = gpt->named_parameters();
  for (const auto& item : ref->named_parameters()) {
    at::Tensor have = mine[item.key()].detach().clone();  // (ZeRO-3: gathers this rank's tp part)
    check_relative(str_cat(tag, "final ", item.key()), have, part(*par, item.key(), item.value().detach()),
                   1e-5);
  }
}

// A module written here, not models::GPT: attention over [B, T, C] and a two-layer MLP on [B*T, C] (2-d,
// libtorch's addmm path), laid out by a plan of its own.
struct UserBlockImpl : torch::nn::Module {
  UserBlockImpl(int64_t c, int64_t heads) : hd(c / heads) {
    q = register_module("q", torch::nn::Linear(c, c));
    k = register_module("k", torch::nn::Linear(c, c));
    v = register_module("v", torch::nn::Linear(c, c));
    o = register_module("o", torch::nn::Linear(c, c));
    up = register_module("up", torch::nn::Linear(c, 3 * c));
    down = register_module("down", torch::nn::Linear(3 * c, c));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto split = [&](const at::Tensor& t) {
      return t.view({t.size(0), t.size(1), t.size(2) / hd, hd}).transpose(1, 2);
    };
    at::Tensor a = at::scaled_dot_product_attention(split(q(x)), split(k(x)), split(v(x)));
    a = a.transpose(1, 2).contiguous();
    at::Tensor h = x + o(a.view({a.size(0), a.size(1), -1}));
    at::Tensor flat = h.view({-1, h.size(-1)});
    return h + down(at::relu(up(flat))).view(h.sizes());
  }
  int64_t hd;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(UserBlock);

parallel::TensorParallelPlan user_plan(int64_t hd) {
  using namespace parallel;
  return TensorParallelPlan{{{"q", ColwiseParallel(hd)},
                             {"k", ColwiseParallel(hd)},
                             {"v", ColwiseParallel(hd)},
                             {"o", RowwiseParallel(hd)},
                             {"up", ColwiseParallel()},
                             {"down", RowwiseParallel()}},
                            false};
}

void check_user_module(const comm::BackendPtr& world) {
  const int64_t n = world->group_size(), heads = n == 2 ? 3 : 5, C = heads * 4;
  auto make = [&] {
    UserBlock m(C, heads);
    m->to(at::kDouble);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.normal_(0.0, 0.2, gen);
    return m;
  };
  UserBlock ref = make(), mine = make();
  auto sgd = [](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2));
  };
  auto ref_opt = sgd(ref->parameters());
  parallel::ParallelConfig pc;
  pc.tp = n;
  pc.tp_plan = user_plan(4);
  auto par = parallel::parallelize(*mine, world, pc, sgd);
  for (int64_t step = 1; step <= 10; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + step);
    at::Tensor x = at::randn({3, 7, C}, gen, at::kDouble), y = at::randn({3, 7, C}, gen, at::kDouble);
    ref_opt->zero_grad();
    at::Tensor rl = (ref(x) - y).pow(2).mean();
    rl.backward();
    ref_opt->step();
    par->zero_grad();
    comm::CommLog::instance().clear();
    at::Tensor l = (mine(x) - y).pow(2).mean();
    l.backward();
    auto c = comm::CommLog::instance().totals();
    // forward: o's and down's sums; backward: up's input gradient (x itself needs none)
    check_true(str_cat("user module step ", step, ": 2 all-reduces forward and 1 backward (got ",
                       c.collectives, " collectives, ", c.by_kind["all_reduce"], " all_reduce)"),
               c.collectives == 3 && c.by_kind["all_reduce"] == 3);
    par->step();
    check_relative(str_cat("user module step ", step, " loss"), l.detach(), rl.detach(), 1e-5);
  }
  auto have = mine->named_parameters();
  for (const auto& item : ref->named_parameters()) {
    check_relative(str_cat("user module final ", item.key()), have[item.key()].detach(),
                   part(*par, item.key(), item.value().detach()), 1e-5);
  }
}

void check_plan_errors(const comm::BackendPtr& world) {
  const int64_t n = world->group_size();
  auto apply = [&](parallel::TensorParallelPlan plan) {
    UserBlock m(24, 3);
    parallel::TensorParallel tp(*m, world, std::move(plan));
  };
  check_throws(
      "a pattern naming no module",
      [&] {
        apply(parallel::TensorParallelPlan{{{"mlp.fc", parallel::ColwiseParallel()}}, false});
      },
      "pattern 'mlp.fc' names no module");
  check_throws(
      "a unit that does not divide the rows",
      [&] {
        apply(parallel::TensorParallelPlan{{{"q", parallel::ColwiseParallel(5)}}, false});
      },
      "module 'q' (ColwiseParallel(unit 5)) parameter 'weight' [24, 24] has 24 rows");
  check_throws(
      "fewer heads than ranks",
      [&] {
        apply(parallel::TensorParallelPlan{{{"q", parallel::ColwiseParallel(24)}}, false});
      },
      n > 1 ? "fewer than the" : "");
  check_throws(
      "a module matched twice",
      [&] {
        apply(parallel::TensorParallelPlan{
            {{"q", parallel::ColwiseParallel()}, {"*", parallel::RowwiseParallel()}}, false});
      },
      "matched by both 'q' and '*'");
  check_throws(
      "SequenceParallel without sequence_parallel",
      [&] {
        apply(parallel::TensorParallelPlan{{{"q", parallel::SequenceParallel()}}, false});
      },
      "sequence_parallel is off");
  if (n > 1) {
    // Loss-parallel logits refuse anything but views and cross_entropy.
    models::GPTConfig cfg = tp_gpt(n);
    models::GPT gpt(cfg);
    parallel::TensorParallel tp(*gpt, world, train::gpt_tensor_parallel_plan(cfg, false));
    at::Tensor idx = at::zeros({1, 4}, at::kLong);
    check_throws(
        "softmax of loss-parallel logits", [&] { at::softmax(gpt->forward(idx), -1); },
        "only views and cross_entropy may read them");
  }
  {
    // A module whose layout is gone keeps its parts, and refuses to run as if they were whole.
    models::GPTConfig cfg = tp_gpt(n);
    models::GPT gpt(cfg);
    { parallel::TensorParallel tp(*gpt, world, train::gpt_tensor_parallel_plan(cfg, false)); }
    check_throws(
        "a module whose TensorParallel was destroyed",
        [&] {
          gpt->forward(at::zeros({1, 4}, at::kLong));
        },
        "whose layout is unknown");
  }
}

}  // namespace

void suite_tp(const comm::BackendPtr& world) {
  const int64_t n = world->group_size();
  for (int64_t acc : {1, 4}) {
    check_gpt(world, "dp", n, false, acc);
    check_gpt(world, "dp", n, true, acc);
  }
  check_user_module(world);
  check_plan_errors(world);
}

void suite_tp2d(const comm::BackendPtr& world) {
  if (world->group_size() != 4) throw ValueError("suite tp2d needs 4 ranks");
  for (int64_t acc : {1, 4}) {
    check_gpt(world, "dp", 2, false, acc);
    check_gpt(world, "zero3", 2, false, acc);
  }
  // the tp groups strided (across hosts, on a real cluster), the dp groups consecutive
  check_gpt(world, "dp", 2, false, 4, {"tp", "dp"});
  check_gpt(world, "zero3", 2, false, 1, {"tp", "dp"});
}

}  // namespace dtrain::test
