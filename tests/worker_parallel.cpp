// The data-parallel suites (see worker_suites.h): parallel::DataParallel on an unmodified models::GPT, each
// rank on its (uneven) rows, against the same model trained on the whole batch in this process with plain
// libtorch; its communication from CommLog; its errors; its memory report.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <string>

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/zero.h"
#include "tensor/comm_log.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

models::GPTConfig small_gpt(int64_t width = 32) {
  models::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = width;
  c.seed = 7;
  return c;
}

// [rows, T + 1] token windows, the same on every rank, different per step.
at::Tensor windows(int64_t rows, const models::GPTConfig& c, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return at::randint(c.vocab_size, {rows, c.block_size + 1}, gen, at::kLong);
}

// ||actual - expected|| <= tol * ||expected||, relative by the norm of the difference. A parameter that is
// zero in exact arithmetic (attention's key bias: softmax ignores it; its gradient is rounding noise) holds
// only float64 noise, about 1e-14: it compares against an absolute floor of 1e-10.
void check_relative(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                    double tol) {
  ++g_checks;
  double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).norm().item<double>();
  double scale = std::max(expected.to(at::kDouble).norm().item<double>(), 1e-10 / tol);
  if (!(diff <= tol * scale)) {
    g_failures += str_cat("FAIL ", what, ": |diff| ", diff, " > ", tol, " x |expected| ", scale, "\n");
  }
}

void check_true(const std::string& what, bool ok) {
  ++g_checks;
  if (!ok) g_failures += str_cat("FAIL ", what, "\n");
}

int64_t param_bytes(torch::nn::Module& m) {
  int64_t b = 0;
  for (const auto& p : m.parameters()) b += p.numel() * p.element_size();
  return b;
}

// 20 AdamW steps at `accumulation` micro-batches per step, buckets of `bucket_bytes`, float64; stage 0 is
// data parallel, 1 and 2 ZeRO.
// shard_size > 0: hsdp (ZeRO-3 within groups of shard_size ranks, replicated across them).
void check_parity(const comm::BackendPtr& world, int stage, int64_t accumulation, int64_t bucket_bytes,
                  int64_t shard_size = 0) {
  const std::string tag = str_cat(shard_size > 0 ? str_cat("hsdp ", shard_size)
                                  : stage == 0   ? "dp"
                                                 : str_cat("zero", stage),
                                  " accumulation ", accumulation, " buckets ", bucket_bytes, ": ");
  const models::GPTConfig cfg = small_gpt();
  const int64_t B = 18, T = cfg.block_size, steps = 20, n = world->group_size(), me = world->group_rank();
  // In float64: float32's rounding differs between one batch and its split into ranks' rows, and AdamW turns
  // that noise into whole steps for gradients that are zero in exact arithmetic (attention's key bias), so
  // only float64 can show the 1e-5 agreement of every parameter.
  models::GPT ref(cfg), gpt(cfg);
  ref->to(at::kDouble);
  gpt->to(at::kDouble);
  auto adamw = [](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
  };
  auto ref_opt = adamw(ref->parameters());
  parallel::DataParallelOptions o;
  o.bucket_bytes = bucket_bytes;
  o.first_bucket_bytes = bucket_bytes / 4;
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<parallel::Zero> zero;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::shared_ptr<mesh::DeviceMesh> mesh;
  if (stage == 0) {
    dp = std::make_unique<parallel::DataParallel>(*gpt, world, o);
    opt = adamw(gpt->parameters());
  } else if (shard_size > 0) {
    mesh = std::make_shared<mesh::DeviceMesh>(world, std::vector<int64_t>{n / shard_size, shard_size},
                                              std::vector<std::string>{"replicate", "shard"});
    zero = std::make_unique<parallel::Zero>(*gpt, mesh->axis_group("shard"), 3, adamw, o,
                                            mesh->axis_group("replicate"));
  } else {
    zero = std::make_unique<parallel::Zero>(*gpt, world, stage, adamw, o);
  }
  const int64_t ns = shard_size > 0 ? shard_size : n;  // ranks sharing one copy of the model state
  // The bucket count (data parallel lays its buckets out again after the first backward).
  auto bucket_count = [&] {
    return static_cast<int64_t>(dp ? dp->buckets().size() : zero->buckets().size());
  };
  const int64_t psi_bytes = param_bytes(*gpt);
  for (int64_t step = 1; step <= steps; ++step) {
    at::Tensor w = windows(B, cfg, step);
    ref_opt->zero_grad();
    at::Tensor ref_loss = ref->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
    ref_loss.backward();
    ref_opt->step();

    dp ? opt->zero_grad() : zero->zero_grad();
    double share = 0;
    for (int64_t k = 0; k < accumulation; ++k) {
      tensor::CommLog::instance().clear();
      parallel::RowRange micro = parallel::split_rows(B, accumulation, k);
      parallel::RowRange mine = parallel::split_rows(micro.count, n, me);
      at::Tensor rows = w.narrow(0, micro.start + mine.start, mine.count);
      const bool last = k == accumulation - 1;
      dp ? dp->set_requires_gradient_sync(last) : zero->set_requires_gradient_sync(last);
      at::Tensor loss = gpt->loss(rows.narrow(1, 0, T).contiguous(), rows.narrow(1, 1, T).contiguous());
      if (stage == 3 && step >= 2) {
        // Forward gathers each unit once (prefetched after the first step), this rank sending its shards.
        tensor::CommTotals f = tensor::CommLog::instance().totals();
        const int64_t nb = bucket_count(), shards = zero->memory().parameters;
        check_true(str_cat(tag, "step ", step, " micro-step ", k, ": forward all-gathers each of the ", nb,
                           " units once, sending this rank's ", shards, " bytes (got ", f.collectives, ", ",
                           f.by_kind["all_gather"], " all_gather, ", f.bytes, " bytes)"),
                   f.collectives == nb && f.by_kind["all_gather"] == nb && f.by_cause["zero3"] == nb &&
                       f.bytes == shards);
        tensor::CommLog::instance().clear();
      }
      const double weight = static_cast<double>(mine.count) / static_cast<double>(B);
      (loss * (weight * static_cast<double>(n))).backward();
      share += loss.item<double>() * weight;
      tensor::CommTotals c = tensor::CommLog::instance().totals();
      if (stage == 3) {
        // Backward gathers again the units it needs (at most each once), and reduce-scatters only at the
        // last micro-step.
        const int64_t nb = bucket_count(), gathers = c.by_kind["all_gather"];
        check_true(
            str_cat(tag, "step ", step, " micro-step ", k, ": backward gathers each unit at most once (",
                    gathers, " all_gather, ", nb, " units)"),
            step == 1 || (gathers >= 1 && gathers <= nb && c.by_cause["zero3"] == gathers));
        // What is left for the checks below: the reduce-scatters.
        c.collectives -= gathers;
        c.by_kind.erase("all_gather");
        c.by_cause.erase("zero3");
        if (shard_size > 0) {  // each reduced shard all-reduced over the replicas
          const int64_t ar = c.by_kind["all_reduce"];
          check_true(str_cat(tag, "step ", step, " micro-step ", k, ": ", last ? nb : 0,
                             " all-reduces over the replicas (got ", ar, ")"),
                     ar == (last ? nb : 0) && c.by_cause["hsdp"] == ar);
          c.collectives -= ar;
          c.by_kind.erase("all_reduce");
          c.by_cause.erase("hsdp");
        }
        c.bytes = 0;
        for (const auto& r : tensor::CommLog::instance().records()) {
          if (r.kind == tensor::StepKind::kReduceScatter) c.bytes += r.bytes;
        }
      }
      if (!last) {
        check_true(str_cat(tag, "step ", step, " micro-step ", k, ": no communication before the last (got ",
                           c.collectives, ")"),
                   c.collectives == 0);
      } else if (step >= 2 || stage > 0) {  // data parallel's first step also agrees on the rebuilt order
        const char* kind = stage == 0 ? "all_reduce" : "reduce_scatter";
        const char* cause = stage == 0 ? "data_parallel" : "zero";
        const int64_t nb = bucket_count();
        check_true(str_cat(tag, "step ", step, ": backward issues only the ", nb, " bucket ", kind, "s (got ",
                           c.collectives, " collectives, ", c.by_kind[kind], " ", kind, ")"),
                   c.collectives == nb && c.by_kind[kind] == nb && c.by_cause[cause] == nb);
        check_true(str_cat(tag, "step ", step, ": the buckets hold 4 bytes per parameter (", c.bytes, " vs ",
                           psi_bytes, ")"),
                   c.bytes == psi_bytes);
      }
    }
    if (step >= 2 && bucket_count() > 1) {  // the first bucket went out while backward still ran
      parallel::PassTimeline t = dp ? dp->last_pass() : zero->last_pass();
      check_true(str_cat(tag, "step ", step, ": the first bucket launched (", t.bucket_launch_s.front(),
                         " s) before the last gradient came (", t.last_gradient_s, " s)"),
                 !t.bucket_launch_s.empty() && t.bucket_launch_s.front() < t.last_gradient_s);
    }
    tensor::CommLog::instance().clear();
    if (dp) {
      opt->step();
    } else {
      zero->step();
    }
    if (stage == 3) {  // the shards are the parameters: nothing to gather
      tensor::CommTotals c = tensor::CommLog::instance().totals();
      check_true(str_cat(tag, "step ", step, ": the step communicates nothing (", c.collectives, ")"),
                 c.collectives == 0);
    } else if (zero) {  // every rank's shards all-gathered: this rank contributes its shard, about 1/n
      tensor::CommTotals c = tensor::CommLog::instance().totals();
      const int64_t nb = bucket_count();
      check_true(str_cat(tag, "step ", step, ": the step all-gathers each bucket once (", c.collectives, ", ",
                         c.by_kind["all_gather"], " all_gather)"),
                 c.collectives == nb && c.by_kind["all_gather"] == nb);
      check_true(str_cat(tag, "step ", step, ": this rank sends its shards (", c.bytes, " bytes of ",
                         psi_bytes, ")"),
                 c.bytes * n >= psi_bytes - 8 * n * nb && c.bytes * n <= psi_bytes + 8 * n * nb);
    }
    at::Tensor l = at::full({1}, share, at::kDouble);
    world->all_reduce(l)->wait();
    check_relative(str_cat(tag, "step ", step, " loss"), l, ref_loss.detach().to(at::kDouble).view({1}),
                   1e-5);
  }
  // Model state per rank (bytes of float64 here: 8 per element): data parallel Ψ parameters, Ψ gradients (in
  // the buckets), 2Ψ AdamW moments; ZeRO-1 the moments of this rank's shard only (Ψ + Ψ + 2Ψ/N); ZeRO-2 its
  // gradient too (Ψ + 3Ψ/N); ZeRO-3 its parameters too (4Ψ/N).
  parallel::ModelStateMemory m = dp ? dp->memory(opt.get()) : zero->memory();
  const int64_t nb = bucket_count();
  if (stage == 3) {
    const int64_t slack = 8 * nb;
    const int64_t shard = m.parameters;
    check_true(str_cat(tag, "memory: ", m.to_string()),
               std::abs(shard * ns - psi_bytes) <= slack * ns && m.gradients == shard &&
                   m.optimizer_state == 2 * shard && m.buckets == 0 && m.buffers == 0);
  } else if (stage == 0) {
    check_true(str_cat(tag, "memory: ", m.to_string()),
               m.parameters == psi_bytes && m.gradients == psi_bytes && m.optimizer_state == 2 * psi_bytes &&
                   m.buckets == 0 && m.buffers == 0);
  } else {
    const int64_t slack = 8 * nb;  // shards of uneven buckets differ by up to one element per bucket
    const int64_t shard = m.optimizer_state / 2;  // this rank's shard (the moments are two of it)
    check_true(str_cat(tag, "memory: ", m.to_string()),
               m.parameters == psi_bytes && std::abs(shard * n - psi_bytes) <= slack * n &&
                   m.gradients == (stage == 1 ? psi_bytes : shard) && m.buckets == 0);
  }
  if (bucket_bytes < psi_bytes) check_true(str_cat(tag, "several buckets (", nb, ")"), nb > 1);
  // (ZeRO-3: reading a parameter gathers it, a collective every rank runs alike)
  auto mine = gpt->named_parameters(), theirs = ref->named_parameters();
  for (const auto& item : theirs) {
    check_relative(str_cat(tag, "final ", item.key()), mine[item.key()], item.value(), 1e-5);
  }
}

// A GPT with one more Linear that forward never uses.
struct WithUnusedImpl : torch::nn::Module {
  WithUnusedImpl() {
    gpt = register_module("gpt", models::GPT(small_gpt()));
    spare = register_module("spare", torch::nn::Linear(4, 4));
  }
  models::GPT gpt{nullptr};
  torch::nn::Linear spare{nullptr};
};
TORCH_MODULE(WithUnused);

void check_unused(const comm::BackendPtr& world) {
  const models::GPTConfig cfg = small_gpt();
  const int64_t T = cfg.block_size;
  at::Tensor w = windows(world->group_size(), cfg, 1).narrow(0, world->group_rank(), 1);
  {
    WithUnused m;
    parallel::DataParallel dp(*m, world);
    std::string error;
    try {
      m->gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()).backward();
    } catch (const std::exception& e) {
      error = e.what();
    }
    check_true(
        str_cat("an unused parameter is an error naming it, got: ", error),
        error.find("received no gradient in this backward: spare.weight, spare.bias") != std::string::npos &&
            error.find("allow_unused") != std::string::npos);
  }
  {
    WithUnused m;
    parallel::DataParallelOptions o;
    o.allow_unused = true;
    parallel::DataParallel dp(*m, world, o);
    m->gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()).backward();
    check_equal("allow_unused: the unused weight's gradient is zero", m->spare->weight.grad(),
                at::zeros_like(m->spare->weight));
    check_true("allow_unused: the used parameters have gradients",
               m->gpt->wte->weight.grad().abs().sum().item<double>() > 0);
  }
}

// The last rank builds a wider model: every rank's error names it and the first difference.
void check_mismatch(const comm::BackendPtr& world) {
  const int n = world->group_size(), me = world->group_rank();
  models::GPT gpt(small_gpt(me == n - 1 ? 48 : 32));
  std::string error;
  try {
    parallel::DataParallel dp(*gpt, world);
  } catch (const ValueError& e) {
    error = e.what();
  }
  check_true(str_cat("a different module on rank ", n - 1, " is named on every rank, got: ", error),
             error.find(str_cat("rank ", n - 1,
                                " has parameter 'wte.weight' Float [64, 48] where rank 0 has "
                                "parameter 'wte.weight' Float [64, 32]")) != std::string::npos);
}

// Rank 0's weights reach every rank: the others start from other seeds.
void check_broadcast(const comm::BackendPtr& world) {
  models::GPTConfig cfg = small_gpt();
  cfg.seed = 100 + world->group_rank();
  models::GPT gpt(cfg);
  parallel::DataParallel dp(*gpt, world);
  cfg.seed = 100;
  models::GPT rank0(cfg);
  auto theirs = rank0->named_parameters();
  for (const auto& item : gpt->named_parameters()) {
    check_equal(str_cat("broadcast ", item.key()), item.value(), theirs[item.key()]);
  }
}

// Values summed with the gradients (side_values): no collective of their own.
void check_side_values(const comm::BackendPtr& world) {
  const int n = world->group_size(), me = world->group_rank();
  const models::GPTConfig cfg = small_gpt();
  const int64_t T = cfg.block_size;
  models::GPT gpt(cfg);
  parallel::DataParallelOptions o;
  o.side_values = 2;
  o.bucket_bytes = 16 << 10;
  parallel::DataParallel dp(*gpt, world, o);
  at::Tensor w = windows(n, cfg, 3).narrow(0, me, 1);
  for (int pass = 0; pass < 2; ++pass) {  // before and after the rebuild
    at::Tensor v = at::tensor({static_cast<double>(me), 2.0 * me + 1 + pass}, at::kDouble);
    dp.reduce_with_gradients(v);
    tensor::CommLog::instance().clear();
    gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()).backward();
    const double sum = n * (n - 1) / 2.0;  // of the ranks' numbers
    check_close(str_cat("side values pass ", pass), v,
                at::tensor({sum, 2.0 * sum + n * (1.0 + pass)}, at::kDouble), 1e-6);
    if (pass == 1) {
      check_true(
          "side values: only the bucket all_reduces",
          tensor::CommLog::instance().totals().collectives == static_cast<int64_t>(dp.buckets().size()));
    }
  }
  bool refused = false;
  try {
    dp.reduce_with_gradients(at::zeros({3}));
  } catch (const ValueError&) {
    refused = true;
  }
  check_true("more side values than side_values is refused", refused);
}

// The last rank asks for other buckets: every rank's error names it before any backward.
void check_layout_mismatch(const comm::BackendPtr& world) {
  const int n = world->group_size(), me = world->group_rank();
  models::GPT gpt(small_gpt());
  parallel::DataParallelOptions o;
  o.bucket_bytes = me == n - 1 ? 8 << 10 : 16 << 10;
  o.first_bucket_bytes = o.bucket_bytes;
  std::string error;
  try {
    parallel::DataParallel dp(*gpt, world, o);
  } catch (const ValueError& e) {
    error = e.what();
  }
  check_true(str_cat("other bucket options on rank ", n - 1, " are named on every rank, got: ", error),
             error.find(str_cat("rank ", n - 1, " lays out other gradient buckets than rank 0")) !=
                 std::string::npos);
}

// Ranks that diverge at a pass's first bucket (the last rank all-reduces something else instead of backward):
// every rank gets the agreement error naming it, and the rest of the pass's buckets (unchecked members of
// the run) never reach the engine. The group is unusable afterwards: this runs last.
void check_diverging_pass(const comm::BackendPtr& world) {
  const int n = world->group_size(), me = world->group_rank();
  const models::GPTConfig cfg = small_gpt();
  const int64_t T = cfg.block_size;
  models::GPT gpt(cfg);
  parallel::DataParallelOptions o;
  o.bucket_bytes = 16 << 10;
  o.first_bucket_bytes = 4 << 10;
  parallel::DataParallel dp(*gpt, world, o);
  at::Tensor w = windows(n, cfg, 5).narrow(0, me, 1);
  std::string error;
  try {
    if (me == n - 1) {
      at::Tensor x = at::ones({3});
      world->all_reduce(x)->wait();
    } else {
      gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()).backward();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  check_true(str_cat("a rank that leaves the pass is named on every rank, got: ", error),
             error.find(str_cat("rank ", n - 1, " passed")) != std::string::npos);
}

// Buffers (BatchNorm's running statistics, which each rank's own rows move differently) equal group rank 0's
// after every synchronised backward; parameters of two dtypes go into buckets of their own.
void check_buffers_and_dtypes(const comm::BackendPtr& world) {
  const int n = world->group_size(), me = world->group_rank();
  torch::nn::Sequential m(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::Linear(3, 2));
  m[2]->to(at::kDouble);
  parallel::DataParallel dp(*m, world);
  check_true(str_cat("a bucket per dtype (", dp.buckets().size(), ")"), dp.buckets().size() == 2);
  at::Tensor x = at::arange(16, at::kFloat).view({4, 4}) * (me + 1) - 3;
  at::Tensor h = m[1]->as<torch::nn::BatchNorm1d>()->forward(m[0]->as<torch::nn::Linear>()->forward(x));
  m[2]->as<torch::nn::Linear>()->forward(h.to(at::kDouble)).sum().backward();
  at::Tensor mean = m[1]->as<torch::nn::BatchNorm1d>()->running_mean;
  at::Tensor all = at::empty({n * mean.numel()}, mean.options());
  world->all_gather(all, mean.contiguous())->wait();
  at::Tensor rows = all.view({n, mean.numel()});
  for (int r = 1; r < n; ++r)
    check_equal(str_cat("running_mean of rank ", r, " is rank 0's"), rows[r], rows[0]);
  check_true("the double Linear got a gradient", m[2]->as<torch::nn::Linear>()->weight.grad().defined());
}

}  // namespace

void suite_zero(const comm::BackendPtr& world) {
  for (int stage : {1, 2, 3}) {
    check_parity(world, stage, 1, int64_t{25} << 20);
    check_parity(world, stage, 4, 16 << 10);
  }
}

// hsdp on a [2, 2] mesh: ZeRO-3 within pairs of ranks, replicated across the pairs.
void suite_hsdp(const comm::BackendPtr& world) {
  if (world->group_size() != 4) throw ValueError("suite hsdp needs 4 ranks");
  check_parity(world, 3, 1, int64_t{25} << 20, 2);
  check_parity(world, 3, 4, 16 << 10, 2);
}

void suite_data_parallel(const comm::BackendPtr& world) {
  check_broadcast(world);
  check_parity(world, 0, 1, int64_t{25} << 20);  // one bucket
  check_parity(world, 0, 4, 16 << 10);           // several, and accumulation
  check_side_values(world);
  check_buffers_and_dtypes(world);
  check_unused(world);
  if (world->group_size() > 1) {
    check_mismatch(world);
    check_layout_mismatch(world);
    check_diverging_pass(world);  // last: the group is unusable afterwards
  }
}

}  // namespace dtrain::test
