// The data-parallel and ZeRO suites (see worker_suites.h): parallel::DataParallel and parallel::Zero on an
// unmodified models::GPT, each rank on its (uneven) rows, against the same model trained on the whole batch
// in this process with plain libtorch (tests/parity_loop.h); their communication from CommLog; their errors;
// their memory report (ZeRO's memory from the allocator: tests/worker_memory.cpp).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <map>
#include <string>
#include <utility>

#include "comm/comm_log.h"
#include "comm/work.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/zero.h"
#include "tests/parity_loop.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

// 20 AdamW steps at `accumulation` micro-batches per step, buckets of `bucket_bytes`, float64; stage 0 is
// data parallel, 1 and 2 ZeRO.
// shard_size > 0: hsdp (ZeRO-3 within groups of shard_size ranks, replicated across them), its mesh's axes
// {"replicate", "shard"} (the shard groups consecutive ranks) or, with `shard_outer`, the other way round.
void check_parity(const comm::BackendPtr& world, int stage, int64_t accumulation, int64_t bucket_bytes,
                  int64_t shard_size = 0, bool shard_outer = false) {
  const std::string tag = str_cat(shard_size > 0 ? str_cat("hsdp ", shard_size, shard_outer ? " strided" : "")
                                  : stage == 0   ? "dp"
                                                 : str_cat("zero", stage),
                                  " accumulation ", accumulation, " buckets ", bucket_bytes, ": ");
  const models::GPTConfig cfg = small_gpt();
  const int64_t B = 18, steps = 20, n = world->group_size(), me = world->group_rank();
  // In float64: float32's rounding differs between one batch and its split into ranks' rows, and AdamW turns
  // that noise into whole steps for gradients that are zero in exact arithmetic (attention's key bias), so
  // only float64 can show the 1e-5 agreement of every parameter.
  auto [ref, gpt] = twin_gpts(cfg, at::kDouble);
  const auto adamw = parity_adamw;
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
    mesh = shard_outer
               ? std::make_shared<mesh::DeviceMesh>(world, std::vector<int64_t>{shard_size, n / shard_size},
                                                    std::vector<std::string>{"shard", "replicate"})
               : std::make_shared<mesh::DeviceMesh>(world, std::vector<int64_t>{n / shard_size, shard_size},
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
  // What the step communicated, by (cause, kind): calls and bytes, gathered from CommLog before each clear,
  // to compare with what the strategy reports (step_collectives).
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> seen;
  auto absorb = [&] {
    for (const auto& r : comm::CommLog::instance().records()) {
      auto& s = seen[{r.cause, comm::to_string(r.kind)}];
      ++s.first;
      s.second += r.bytes;
    }
    comm::CommLog::instance().clear();
  };
  auto check_report = [&](int64_t step) {
    for (const auto& c : dp ? dp->step_collectives() : zero->step_collectives()) {
      const auto it = seen.find({c.cause, c.kind});
      const int64_t calls = it == seen.end() ? 0 : it->second.first;
      const int64_t bytes = it == seen.end() ? 0 : it->second.second;
      const std::string what =
          str_cat(tag, "step ", step, ": reported ", c.count, " x ", c.kind, " under ", c.cause, " of ",
                  c.bytes, " bytes; the log has ", calls, " of ", bytes);
      if (c.per_micro_batch) {  // an upper bound per micro-batch
        check_true(what, calls >= 1 && calls <= c.count * accumulation && bytes <= c.bytes * accumulation);
      } else {
        check_true(what, calls == c.count && bytes == c.bytes);
      }
      if (it != seen.end()) seen.erase(it);
    }
    std::string rest;
    for (const auto& [key, v] : seen) rest += str_cat(" ", v.first, " x ", key.second, " under ", key.first);
    check_true(str_cat(tag, "step ", step, ": nothing unreported in the log (got", rest, ")"), seen.empty());
  };
  ParityLoop loop;
  loop.tag = tag;
  loop.steps = steps;
  loop.accumulation = accumulation;
  loop.dp_size = n;
  loop.dp_rank = me;
  loop.micro_batch = [&](int64_t step, int64_t k) {
    const Range micro = balanced_part(B, accumulation, k);
    return token_windows(B, cfg, 1000 + step).narrow(0, micro.start, micro.count);
  };
  loop.before_micro = [&](int64_t, int64_t) { absorb(); };
  loop.after_forward = [&](int64_t step, int64_t k) {
    if (stage != 3 || step < 2) return;
    // Forward gathers each unit once (prefetched after the first step), this rank sending its shards.
    comm::CommTotals f = comm::CommLog::instance().totals();
    const int64_t nb = bucket_count(), shards = zero->memory().parameters;
    check_true(str_cat(tag, "step ", step, " micro-step ", k, ": forward all-gathers each of the ", nb,
                       " units once, sending this rank's ", shards, " bytes (got ", f.collectives, ", ",
                       f.by_kind["all_gather"], " all_gather, ", f.bytes, " bytes)"),
               f.collectives == nb && f.by_kind["all_gather"] == nb && f.by_cause["zero3"] == nb &&
                   f.bytes == shards);
    absorb();
  };
  loop.after_backward = [&](int64_t step, int64_t k) {
    const bool last = k == accumulation - 1;
    comm::CommTotals c = comm::CommLog::instance().totals();
    if (stage == 3) {
      // Backward gathers again the units it needs (at most each once), and reduce-scatters only at the
      // last micro-step.
      const int64_t nb = bucket_count(), gathers = c.by_kind["all_gather"];
      check_true(str_cat(tag, "step ", step, " micro-step ", k, ": backward gathers each unit at most once (",
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
      for (const auto& r : comm::CommLog::instance().records()) {
        if (r.kind == comm::StepKind::kReduceScatter) c.bytes += r.bytes;
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
  };
  loop.before_step = [&](int64_t step) {
    if (step >= 2 && bucket_count() > 1) {  // the first bucket went out while backward still ran
      parallel::PassTimeline t = dp ? dp->last_pass() : zero->last_pass();
      check_true(str_cat(tag, "step ", step, ": the first bucket launched (", t.bucket_launch_s.front(),
                         " s) before the last gradient came (", t.last_gradient_s, " s)"),
                 !t.bucket_launch_s.empty() && t.bucket_launch_s.front() < t.last_gradient_s);
    }
    absorb();
  };
  loop.after_step = [&](int64_t step) {
    if (stage == 3) {  // the shards are the parameters: nothing to gather
      comm::CommTotals c = comm::CommLog::instance().totals();
      check_true(str_cat(tag, "step ", step, ": the step communicates nothing (", c.collectives, ")"),
                 c.collectives == 0);
    } else if (zero) {  // every rank's shards all-gathered: this rank contributes its shard, about 1/n
      comm::CommTotals c = comm::CommLog::instance().totals();
      const int64_t nb = bucket_count();
      check_true(str_cat(tag, "step ", step, ": the step all-gathers each bucket once (", c.collectives, ", ",
                         c.by_kind["all_gather"], " all_gather)"),
                 c.collectives == nb && c.by_kind["all_gather"] == nb);
      check_true(str_cat(tag, "step ", step, ": this rank sends its shards (", c.bytes, " bytes of ",
                         psi_bytes, ")"),
                 c.bytes * n >= psi_bytes - 8 * n * nb && c.bytes * n <= psi_bytes + 8 * n * nb);
    }
    absorb();
    if (step >= 2) check_report(step);  // (data parallel's first backward also lays its buckets out again)
    seen.clear();
  };
  ParallelSide side;
  if (dp) {
    side = {[&] { opt->zero_grad(); }, [&](bool sync) { dp->set_requires_gradient_sync(sync); },
            [&] { opt->step(); }};
  } else {
    side = {[&] { zero->zero_grad(); }, [&](bool sync) { zero->set_requires_gradient_sync(sync); },
            [&] { zero->step(); }};
  }
  run_parity(world, ref, *ref_opt, gpt, side, loop);
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
  at::Tensor w = token_windows(world->group_size(), cfg, 1001).narrow(0, world->group_rank(), 1);
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
  at::Tensor w = token_windows(n, cfg, 1003).narrow(0, me, 1);
  for (int pass = 0; pass < 2; ++pass) {  // before and after the rebuild
    at::Tensor v = at::tensor({static_cast<double>(me), 2.0 * me + 1 + pass}, at::kDouble);
    dp.reduce_with_gradients(v);
    comm::CommLog::instance().clear();
    gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()).backward();
    const double sum = n * (n - 1) / 2.0;  // of the ranks' numbers
    check_close(str_cat("side values pass ", pass), v,
                at::tensor({sum, 2.0 * sum + n * (1.0 + pass)}, at::kDouble), 1e-6);
    if (pass == 1) {
      check_true("side values: only the bucket all_reduces",
                 comm::CommLog::instance().totals().collectives == static_cast<int64_t>(dp.buckets().size()));
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
  at::Tensor w = token_windows(n, cfg, 1005).narrow(0, me, 1);
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
  check_zero_memory(world);
}

// hsdp on a [2, 2] mesh: ZeRO-3 within pairs of ranks, replicated across the pairs.
void suite_hsdp(const comm::BackendPtr& world) {
  if (world->group_size() != 4) throw ValueError("suite hsdp needs 4 ranks");
  check_parity(world, 3, 1, int64_t{25} << 20, 2);
  check_parity(world, 3, 4, 16 << 10, 2);
  check_parity(world, 3, 4, 16 << 10, 2, true);  // (--mesh-order shard,replicate)
}

// Overlap: on a simulated link that each collective occupies for `busy`, one after another
// (comm::set_simulated_link, a slower network), a synchronised backward under data parallel takes less than
// backward alone plus its bucket all-reduces one after another: the first buckets go out while backward still
// runs. `busy` is half of backward alone, so that the saving (the part of backward the link overlaps) is a
// sizeable part of the whole.
void check_overlap(const comm::BackendPtr& world) {
  if (world->group_size() == 1) return;
  // backward long against the engine's own collectives (about 1 ms each on Gloo here), a few buckets
  const models::GPTConfig cfg = small_gpt(64);
  const int64_t T = cfg.block_size, me = world->group_rank(), n = world->group_size(), rows = 64;
  models::GPT gpt(cfg);
  parallel::DataParallelOptions o;
  o.bucket_bytes = 96 << 10;
  o.first_bucket_bytes = 32 << 10;
  parallel::DataParallel dp(*gpt, world, o);
  at::Tensor w = token_windows(rows * n, cfg, 1001).narrow(0, rows * me, rows);
  auto backward = [&](bool sync) {
    gpt->zero_grad();
    dp.set_requires_gradient_sync(sync);
    at::Tensor loss = gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
    world->barrier()->wait();
    auto t0 = std::chrono::steady_clock::now();
    loss.backward();  // with sync: returns once every bucket is reduced
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto median3 = [&](bool sync) {
    double a = backward(sync), b = backward(sync), c = backward(sync);
    return std::max(std::min(a, b), std::min(std::max(a, b), c));
  };
  backward(true);  // the first pass lays the buckets out again
  double alone = median3(false);
  // the same on every rank (the slowest's), so that the ranks simulate the same link
  at::Tensor a = at::full({1}, alone, at::kDouble);
  world->all_reduce(a, {comm::ReduceOp::kMax})->wait();
  alone = a.item<double>();
  const auto busy = std::chrono::microseconds(static_cast<int64_t>(alone / 2 * 1e6));
  comm::set_simulated_link(busy);
  comm::CommLog::instance().clear();
  backward(true);
  const int64_t k = comm::CommLog::instance().totals().collectives;
  const double synced = median3(true);
  comm::set_simulated_link(std::chrono::microseconds(0));
  const double b = std::chrono::duration<double>(busy).count();
  const double one_after_another = alone + static_cast<double>(k) * b;
  check_true(str_cat("overlap: ", k, " bucket all-reduces each holding the link ", b,
                     " s; a synchronised backward takes ", synced, " s, backward alone ", alone,
                     " s, the two one after another ", one_after_another, " s: a quarter of backward less"),
             k >= 3 && synced < one_after_another - alone / 4);
  if (me == 0) {
    std::fprintf(stderr,
                 "overlap: %ld buckets, link %.4f s each, synced %.4f s, alone %.4f s, sequential %.4f s\n",
                 static_cast<long>(k), b, synced, alone, one_after_another);
  }
}

void suite_data_parallel(const comm::BackendPtr& world) {
  check_broadcast(world);
  check_overlap(world);
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
