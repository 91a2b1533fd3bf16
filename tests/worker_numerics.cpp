// The numerics suites (see worker_suites.h): optim::clip_grad_norm under every strategy against
// torch::nn::utils::clip_grad_norm_ on one process; the composition matrix of strategies, precisions and
// accumulation.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <fstream>
#include <string>

#include "apps/dtrain/gpt/train_gpt.h"
#include "comm/comm_log.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "models/gpt.h"
#include "optim/clip.h"
#include "optim/mixed_precision.h"
#include "parallel/activation_checkpointing.h"
#include "parallel/data_parallel.h"
#include "parallel/parallelize.h"
#include "tests/parity_loop.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

models::GPTConfig clip_gpt() {
  models::GPTConfig c;
  c.vocab_size = 48;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.seed = 21;
  return c;
}

// 5 AdamW steps with the gradients clipped to half of the first step's norm (so that every step clips), in
// float64, under `strategy` × tp, against one process with libtorch's clip_grad_norm_: each step's norm
// within 1e-6, each final parameter within 1e-5; the clipping itself one all-reduce of 8 bytes, no gradient
// gathered.
void check_clip(const comm::BackendPtr& world, const std::string& strategy, int64_t tp,
                int64_t shard_size = 0, bool sp = false) {
  const std::string tag = str_cat("clip ", strategy, " x tp ", tp, sp ? " + sequence parallel" : "", ": ");
  const models::GPTConfig cfg = clip_gpt();
  const int64_t B = 7, T = cfg.block_size;
  const int64_t ndp = world->group_size() / tp, dp_rank = world->group_rank() / tp;
  auto [ref, gpt] = twin_gpts(cfg, at::kDouble);
  const auto adamw = parity_adamw;
  auto ref_opt = adamw(ref->parameters());
  parallel::ParallelConfig pc;
  pc.strategy = strategy;
  pc.tp = tp;
  pc.shard_size = shard_size;
  if (tp > 1) pc.tp_plan = train::gpt_tensor_parallel_plan(cfg, sp);
  auto par = parallel::parallelize(*gpt, world, pc, adamw);
  double max_norm = 0, ref_norm = 0;
  ParityLoop loop;
  loop.tag = tag;
  loop.steps = 5;
  loop.dp_size = ndp;
  loop.dp_rank = dp_rank;
  loop.tp = tp;
  loop.micro_batch = [&](int64_t step, int64_t) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(900 + step);
    return at::randint(cfg.vocab_size, {B, T + 1}, gen, at::kLong);
  };
  loop.reference_before_step = [&](int64_t step) {
    if (step == 1) {
      double sq = 0;
      for (const auto& p : ref->parameters()) sq += p.grad().pow(2).sum().item<double>();
      max_norm = 0.5 * std::sqrt(sq);
    }
    ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm);
  };
  loop.before_step = [&](int64_t step) {
    comm::CommLog::instance().clear();
    const double norm = optim::clip_grad_norm(*par, max_norm);
    auto c = comm::CommLog::instance().totals();
    int64_t clip_bytes = 0;
    for (const auto& r : comm::CommLog::instance().records()) {
      if (r.cause == "clip_grad_norm") clip_bytes += r.bytes;
    }
    // (under sequence parallel the step's whole-parameter gradients are summed first, once)
    check_true(
        str_cat(tag, "step ", step, ": clipping issues one all-reduce of 8 bytes (got ", c.collectives,
                " collectives, ", c.by_cause["clip_grad_norm"], " for the norm, of ", clip_bytes, " bytes)"),
        c.by_cause["clip_grad_norm"] == 1 && clip_bytes == 8 && c.by_kind["all_reduce"] == c.collectives &&
            c.collectives == (sp ? 2 : 1) && (!sp || c.by_cause["tp sequence-parallel gradients"] == 1));
    check_relative(str_cat(tag, "step ", step, " norm"), at::full({1}, norm, at::kDouble),
                   at::full({1}, ref_norm, at::kDouble), 1e-6);
  };
  run_parity(world, ref, *ref_opt, gpt, side_of(*par), loop);
  check_final_parameters(tag, ref, gpt, *par, 1e-5);
}

// One cell of the composition matrix: `steps` AdamW steps of models::GPT under `strategy` x tp, in
// `precision`, with `acc` micro-batches per step and global-norm clipping on, against the same recipe on one
// process with plain libtorch (the model in `precision`; fp32 masters stepped by AdamW; fp16's loss scaled
// by 2^10 and unscaled into the masters; the masters' gradients clipped by clip_grad_norm_). Each step's loss
// and clipped norm within a bound from the format: fp32 relative 1e-5 (the final parameters 1e-3); bf16
// and fp16 4u relative, u the unit roundoff (2^-8 bf16: 1.6e-2; 2^-11 fp16: 2.0e-3). At `inf_step` the last
// rank's gradients hold an inf: every rank skips that step (the parameters stay) and training goes on.
struct Cell {
  std::string strategy = "dp";
  int64_t tp = 1, shard_size = 0;
  optim::Precision precision = optim::Precision::kFp32;
  int64_t acc = 1, steps = 20, inf_step = 0;
  bool reduce_fp32 = false;  // DataParallelOptions::reduce_dtype float32
};

void check_cell(const comm::BackendPtr& world, const Cell& cell) {
  const optim::Precision precision = cell.precision;
  const std::string tag =
      str_cat("matrix ", cell.strategy, " x tp ", cell.tp, " ", optim::to_string(precision), " acc ",
              cell.acc, cell.reduce_fp32 ? " reduced in fp32" : "", ": ");
  const at::ScalarType dt = optim::compute_dtype(precision);
  const double tol = precision == optim::Precision::kBf16   ? 4.0 / 256
                     : precision == optim::Precision::kFp16 ? 4.0 / 2048
                                                            : 1e-5;
  const models::GPTConfig cfg = clip_gpt();
  const int64_t B = 7, T = cfg.block_size, n = world->group_size(), me = world->group_rank();
  const int64_t ndp = n / cell.tp, dp_rank = me / cell.tp;
  auto [ref, gpt] = twin_gpts(cfg, dt);
  const auto adamw = parity_adamw;
  const bool fp32 = precision == optim::Precision::kFp32;
  // the reference: masters by hand (fp32: the parameters themselves)
  std::vector<at::Tensor> ref_params = ref->parameters(), ref_masters;
  for (const auto& p : ref_params) {
    ref_masters.push_back(fp32 ? p : p.detach().to(at::kFloat).clone().requires_grad_(true));
  }
  auto ref_opt = adamw(ref_masters);
  // (fp16: 2^10, so that the scaled loss stays finite in fp16 and the scale stays put over these steps)
  const double scale = precision == optim::Precision::kFp16 ? 1024.0 : 1.0;
  optim::LossScalerOptions so;
  so.initial_scale = 1024;
  optim::MixedPrecision mp(precision, so);
  parallel::ParallelConfig pc;
  pc.strategy = cell.strategy;
  pc.tp = cell.tp;
  pc.shard_size = cell.shard_size;
  if (cell.reduce_fp32) pc.reduction.reduce_dtype = at::kFloat;
  if (cell.tp > 1) pc.tp_plan = train::gpt_tensor_parallel_plan(cfg, false);
  optim::MixedPrecision::check(precision, pc);
  auto par = parallel::parallelize(*gpt, world, pc, mp.wrap(adamw));
  double max_norm = 0;
  for (int64_t step = 1; step <= cell.steps; ++step) {
    std::vector<at::Tensor> batch;
    double ref_loss = 0;
    for (int64_t k = 0; k < cell.acc; ++k) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(700 + 10 * step + k);
      batch.push_back(at::randint(cfg.vocab_size, {B, T + 1}, gen, at::kLong));
      const at::Tensor& w = batch.back();
      at::Tensor l = ref->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
      (l * (scale / static_cast<double>(cell.acc))).backward();
      ref_loss += l.item<double>() / static_cast<double>(cell.acc);
    }
    double ref_norm = 0;
    if (step != cell.inf_step) {
      at::NoGradGuard no_grad;
      if (!fp32) {
        for (size_t i = 0; i < ref_params.size(); ++i) {
          ref_masters[i].mutable_grad() = ref_params[i].grad().to(at::kFloat) / scale;
          ref_params[i].mutable_grad().reset();
        }
      }
      if (step == 1) {  // half the first step's norm: every step clips
        double sq = 0;
        for (const auto& m : ref_masters) sq += m.grad().to(at::kDouble).pow(2).sum().item<double>();
        max_norm = 0.5 * std::sqrt(sq);
      }
      ref_norm = torch::nn::utils::clip_grad_norm_(ref_masters, max_norm);
      ref_opt->step();
      if (!fp32) {
        for (size_t i = 0; i < ref_params.size(); ++i) ref_params[i].detach().copy_(ref_masters[i]);
      }
    } else {
      for (auto& p : ref_params) p.mutable_grad().reset();
    }
    ref_opt->zero_grad();

    std::vector<at::Tensor> before;
    if (step == cell.inf_step) {  // (ZeRO-3: reading the parameters gathers them, on every rank alike)
      for (const auto& p : gpt->parameters()) before.push_back(p.detach().clone());
    }
    // An inf on the last rank: in one gradient element under dp (the others' stay finite: only the check's
    // all-reduce tells them); under ZeRO, whose reduced gradients live in the shards, and tensor parallel, in
    // its loss.
    const bool poison = step == cell.inf_step && me == n - 1;
    const Range mine = balanced_part(B, ndp, dp_rank);
    double share = 0;  // this rank's part of the step's loss
    par->zero_grad();
    for (int64_t k = 0; k < cell.acc; ++k) {
      par->set_requires_gradient_sync(k == cell.acc - 1);
      at::Tensor rows = batch[k].narrow(0, mine.start, mine.count);
      at::Tensor loss = gpt->loss(rows.narrow(1, 0, T).contiguous(), rows.narrow(1, 1, T).contiguous());
      const double inf_loss = poison && k == cell.acc - 1 && cell.strategy != "dp" ? INFINITY : 1.0;
      (loss * (static_cast<double>(mine.count * ndp) / static_cast<double>(B * cell.acc) * mp.loss_scale() *
               inf_loss))
          .backward();
      share +=
          loss.item<double>() * static_cast<double>(mine.count) / static_cast<double>(B * cell.acc * cell.tp);
    }
    if (poison && cell.strategy == "dp") gpt->parameters().front().grad().view({-1})[0] = INFINITY;
    if (cell.strategy == "dp" && par->data_parallel()) {  // (the buckets' dtype is the gradients')
      const at::ScalarType got = gpt->parameters().front().grad().scalar_type();
      check_true(str_cat(tag, "step ", step, ": gradients reduced in ", c10::toString(got)),
                 got == (cell.reduce_fp32 ? at::kFloat : dt));
    }
    comm::CommLog::instance().clear();
    const bool ok = mp.unscale(*par);
    check_true(str_cat(tag, "step ", step, ": the overflow check is one all-reduce or none (got ",
                       comm::CommLog::instance().totals().collectives, ")"),
               comm::CommLog::instance().totals().collectives == (fp32 ? 0 : 1));
    check_true(
        str_cat(tag, "step ", step, (step == cell.inf_step ? ": skipped" : ": taken"), " on every rank"),
        ok == (step != cell.inf_step));
    if (ok) {
      const double norm = optim::clip_grad_norm(*par, max_norm);
      check_relative(str_cat(tag, "step ", step, " clipped norm"), at::full({1}, norm, at::kDouble),
                     at::full({1}, ref_norm, at::kDouble), tol);
      par->step([&] { mp.copy_back(); });
    } else {
      par->zero_grad();
      auto params = gpt->parameters();
      bool same = true;
      for (size_t i = 0; i < params.size(); ++i) same = same && at::equal(params[i].detach(), before[i]);
      check_true(str_cat(tag, "step ", step, ": the skipped step leaves the parameters as they were"), same);
    }
    at::Tensor l = at::full({1}, share, at::kDouble);
    world->all_reduce(l)->wait();
    check_relative(str_cat(tag, "step ", step, " loss"), l, at::full({1}, ref_loss, at::kDouble), tol);
  }
  check_true(str_cat(tag, "steps skipped: ", mp.skipped()), mp.skipped() == (cell.inf_step > 0 ? 1 : 0));
  if (!fp32) return;
  auto have = gpt->named_parameters();
  for (const auto& item : ref->named_parameters()) {
    const at::Tensor expected = part_of(*par, item.key(), item.value().detach());
    const at::Tensor got = have[item.key()].detach().clone();
    if (item.key().find("attn.k.bias") != std::string::npos) {
      // attention's key bias: softmax ignores it, its gradient is fp32 rounding noise (about 1e-7) that
      // AdamW's normalisation turns into steps; it stays within 1e-3 of the reference's
      const double d = (got - expected).abs().max().item<double>();
      check_true(str_cat(tag, "final ", item.key(), " within 1e-3 (got ", d, ")"), d <= 1e-3);
      continue;
    }
    // AdamW divides each element's step by its gradient's size, so an element whose gradient is near zero
    // moves on fp32 rounding: the parameters agree to 1e-3 after 20 steps (a wrong shard or a missed
    // reduction differs by O(1)), the losses to 1e-5
    check_relative(str_cat(tag, "final ", item.key()), got, expected, 1e-3);
  }
}
// Deterministic mode: 20 AdamW steps of models::GPT, each over K = 4 micro-batches of M = 3 rows, rank r
// taking micro-batches r*c .. r*c + c - 1 (c = K / world size) under `strategy` with small buckets (several
// per model). Without clipping, every parameter is bitwise equal to plain libtorch on one process summing the
// K micro-batches' gradients as the same balanced tree ((g0 + g1) + (g2 + g3)). With clipping (and the
// `precision`), the parameters' digest goes to `digests` for the test to compare across world sizes.
constexpr int64_t kDetMicro = 4, kDetRows = 3, kDetSteps = 20;

uint64_t digest(torch::nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    at::Tensor t = p.detach().clone();  // (ZeRO-3: gathered)
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    for (int64_t k = 0; k < t.numel() * t.element_size(); ++k) h = (h ^ b[k]) * 1099511628211ull;
  }
  return h;
}

void check_deterministic(const comm::BackendPtr& world, const std::string& strategy, bool clip,
                         optim::Precision precision, std::ofstream& digests) {
  const std::string tag =
      str_cat("deterministic ", strategy, clip ? " + clip " : " ", optim::to_string(precision), ": ");
  const models::GPTConfig cfg = clip_gpt();
  const int64_t T = cfg.block_size, n = world->group_size(), me = world->group_rank(), c = kDetMicro / n;
  const at::ScalarType dt = optim::compute_dtype(precision);
  auto [ref, gpt] = twin_gpts(cfg, dt);
  optim::MixedPrecision mp(precision);
  parallel::ParallelConfig pc;
  pc.strategy = strategy;
  pc.reduction.bucket_bytes = 16 << 10;
  pc.reduction.first_bucket_bytes = 4 << 10;
  pc.reduction.deterministic = true;
  auto par = parallel::parallelize(*gpt, world, pc, mp.wrap(parity_adamw));
  const bool reference = !clip && precision == optim::Precision::kFp32;
  auto ref_opt = parity_adamw(ref->parameters());
  auto window = [&](int64_t step, int64_t k) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + 10 * step + k);
    return at::randint(cfg.vocab_size, {kDetRows, T + 1}, gen, at::kLong);
  };
  for (int64_t step = 1; step <= kDetSteps; ++step) {
    if (reference) {  // plain libtorch: each micro-batch's gradient alone, then the tree
      std::vector<std::vector<at::Tensor>> leaves;
      for (int64_t k = 0; k < kDetMicro; ++k) {
        ref_opt->zero_grad();
        at::Tensor w = window(step, k);
        (ref->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()) * (1.0 / kDetMicro))
            .backward();
        leaves.emplace_back();
        for (const auto& p : ref->parameters()) leaves.back().push_back(p.grad().clone());
      }
      auto params = ref->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() =
            (leaves[0][i] + leaves[1][i]) + (leaves[2][i] + leaves[3][i]);  // kDetMicro == 4
      }
      ref_opt->step();
    }
    par->zero_grad();
    for (int64_t k = 0; k < c; ++k) {
      par->set_requires_gradient_sync(k == c - 1);
      at::Tensor w = window(step, me * c + k);
      at::Tensor loss = gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
      // (deterministic mode sums: each micro-batch's loss scaled by 1 / all micro-batches, at every world
      // size)
      (loss.to(at::kFloat) * (mp.loss_scale() / static_cast<double>(kDetMicro))).backward();
    }
    if (mp.unscale(*par)) {
      if (clip) optim::clip_grad_norm(*par, 0.5);
      par->step([&] { mp.copy_back(); });
    } else {
      par->zero_grad();
    }
  }
  if (reference) {
    auto have = gpt->named_parameters();
    for (const auto& item : ref->named_parameters()) {
      check_equal(str_cat(tag, "bitwise ", item.key()), have[item.key()].detach().clone(),
                  item.value().detach());
    }
  }
  const uint64_t d = digest(*gpt);
  // every rank holds the same parameters (ZeRO-3: gathered alike)
  at::Tensor mine = at::full({1}, static_cast<int64_t>(d >> 1), at::kLong), all = at::empty({n}, at::kLong);
  world->all_gather(all, mine)->wait();
  check_true(str_cat(tag, "every rank the same parameters"), (all == all[0]).all().item<bool>());
  if (me == 0)
    digests << strategy << (clip ? "+clip " : " ") << optim::to_string(precision) << " " << std::hex << d
            << std::dec << "\n";
}

// A step whose micro-batch count on a rank is not a power of 2 is refused, naming the count.
void check_deterministic_refusals(const comm::BackendPtr& world) {
  const models::GPTConfig cfg = clip_gpt();
  auto [ref, gpt] = twin_gpts(cfg, at::kFloat);
  parallel::ParallelConfig pc;
  pc.reduction.deterministic = true;
  auto par = parallel::parallelize(*gpt, world, pc, parity_adamw);
  std::string error;
  try {
    for (int k = 0; k < 3; ++k) {
      par->set_requires_gradient_sync(k == 2);
      at::Tensor w = at::randint(cfg.vocab_size, {2, cfg.block_size + 1}, at::kLong);
      gpt->loss(w.narrow(1, 0, cfg.block_size).contiguous(), w.narrow(1, 1, cfg.block_size).contiguous())
          .backward();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  check_true(str_cat("deterministic: 3 micro-batches refused (got '", error, "')"),
             error.find("this step had 3 micro-batches") != std::string::npos &&
                 error.find("power of 2") != std::string::npos);
  pc.strategy = "hsdp";
  pc.shard_size = 1;
  error.clear();
  if (world->group_size() >= 2) {
    try {
      parallel::validate_parallel_config(pc, world->group_size());
    } catch (const std::exception& e) {
      error = e.what();
    }
    check_true(str_cat("deterministic: hsdp refused (got '", error, "')"),
               error.find("deterministic mode is built for dp and zero1-3") != std::string::npos);
  }
}

// Activation checkpointing per block (parallelize's checkpoint pattern "h*") under `strategy` x tp in
// float64: 6 AdamW steps at accumulation 2 of a GPT whose blocks recompute their activations in backward,
// against one process without checkpointing: each step's loss within 1e-9 relative, the final parameters
// within 1e-9; each block recomputed once per micro-batch.
void check_checkpointing(const comm::BackendPtr& world, const std::string& strategy, int64_t tp,
                         int64_t shard_size = 0) {
  const std::string tag = str_cat("checkpointing ", strategy, " x tp ", tp, ": ");
  const models::GPTConfig cfg = clip_gpt();
  const int64_t B = 7, T = cfg.block_size, acc = 2;
  const int64_t ndp = world->group_size() / tp, dp_rank = world->group_rank() / tp;
  auto [ref, gpt] = twin_gpts(cfg, at::kDouble);
  auto ref_opt = parity_adamw(ref->parameters());
  parallel::ParallelConfig pc;
  pc.strategy = strategy;
  pc.tp = tp;
  pc.shard_size = shard_size;
  pc.activation_checkpointing = {"h*"};  // every block
  if (tp > 1) pc.tp_plan = train::gpt_tensor_parallel_plan(cfg, false);
  auto par = parallel::parallelize(*gpt, world, pc, parity_adamw);
  ParityLoop loop;
  loop.tag = tag;
  loop.steps = 6;
  loop.accumulation = acc;
  loop.dp_size = ndp;
  loop.dp_rank = dp_rank;
  loop.tp = tp;
  loop.loss_tol = 1e-9;
  loop.micro_batch = [&](int64_t step, int64_t k) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + 10 * step + k);
    return at::randint(cfg.vocab_size, {B, T + 1}, gen, at::kLong);
  };
  int64_t before = 0;
  loop.before_micro = [&](int64_t, int64_t k) {
    if (k == 0) before = parallel::activation_recomputations();
  };
  loop.before_step = [&](int64_t step) {
    check_true(str_cat(tag, "step ", step, ": each block recomputed once per micro-batch (",
                       parallel::activation_recomputations() - before, " recomputations)"),
               parallel::activation_recomputations() - before == cfg.n_layer * acc);
  };
  run_parity(world, ref, *ref_opt, gpt, side_of(*par), loop);
  check_final_parameters(tag, ref, gpt, *par, 1e-9);
}

// Dropout under checkpointing: the recomputation draws the same masks, so the gradients equal those of the
// same model without checkpointing (one process).
void check_checkpointing_dropout() {
  models::GPTConfig cfg = clip_gpt();
  cfg.dropout = 0.2;
  auto [ref, gpt] = twin_gpts(cfg, at::kDouble);
  parallel::checkpoint_activations(*gpt, {"h*"});
  at::Tensor w = at::randint(cfg.vocab_size, {3, cfg.block_size + 1}, at::kLong);
  at::manual_seed(77);
  ref->loss(w.narrow(1, 0, cfg.block_size).contiguous(), w.narrow(1, 1, cfg.block_size).contiguous())
      .backward();
  at::manual_seed(77);
  gpt->loss(w.narrow(1, 0, cfg.block_size).contiguous(), w.narrow(1, 1, cfg.block_size).contiguous())
      .backward();
  auto have = gpt->named_parameters();
  for (const auto& item : ref->named_parameters()) {
    check_relative(str_cat("checkpointing with dropout: gradient of ", item.key()), have[item.key()].grad(),
                   item.value().grad(), 1e-12);
  }
}

}  // namespace

void suite_deterministic(const comm::BackendPtr& world, const std::string& dir) {
  std::ofstream digests(str_cat(dir, "/digests.txt"));
  for (const char* s : {"dp", "zero1", "zero2", "zero3"}) {
    check_deterministic(world, s, false, optim::Precision::kFp32, digests);
    check_deterministic(world, s, true, optim::Precision::kFp32, digests);
  }
  check_deterministic(world, "dp", true, optim::Precision::kBf16, digests);
  check_deterministic(world, "zero3", true, optim::Precision::kFp16, digests);
  check_deterministic_refusals(world);
}

// parallelize's checkpoint patterns: one naming no module, or a module that cannot recompute, is refused
// before anything changes.
void check_checkpointing_refusals(const comm::BackendPtr& world) {
  for (const auto& [pattern, expected] : std::vector<std::pair<std::string, std::string>>{
           {"blocks*", "names no module. The module's submodules: wte, wpe, drop, h0, "},
           {"h0.attn", "names module 'h0.attn', which cannot recompute its activations"}}) {
    auto [ref, gpt] = twin_gpts(clip_gpt(), at::kFloat);
    parallel::ParallelConfig pc;
    pc.activation_checkpointing = {pattern};
    std::string error;
    try {
      parallel::parallelize(*gpt, world, pc, parity_adamw);
    } catch (const ValueError& e) {
      error = e.what();
    }
    check_true(str_cat("checkpoint pattern '", pattern, "' refused (got '", error, "')"),
               error.find(expected) != std::string::npos);
  }
}

void suite_checkpointing(const comm::BackendPtr& world) {
  const int64_t n = world->group_size();
  if (n == 1) check_checkpointing_dropout();
  check_checkpointing_refusals(world);
  for (const char* s : {"dp", "zero1", "zero2", "zero3"}) check_checkpointing(world, s, 1);
  if (n > 1) check_checkpointing(world, "dp", n);
  if (n == 4) {
    check_checkpointing(world, "hsdp", 1, 2);
    check_checkpointing(world, "zero3", 2);
  }
}

void suite_clip(const comm::BackendPtr& world) {
  const int64_t n = world->group_size();
  for (const char* s : {"dp", "zero1", "zero2", "zero3"}) check_clip(world, s, 1);
  if (n == 4) check_clip(world, "hsdp", 1, 2);
  if (n > 1) {
    check_clip(world, "dp", n);
    check_clip(world, "dp", n, 0, true);
  }
  if (n == 4) {
    check_clip(world, "dp", 2);
    check_clip(world, "zero3", 2);
    check_clip(world, "zero1", 2);
  }
}

// The composition matrix: {dp, zero1, zero2, zero3, tp} at this world size (2 or 3 ranks) or {hsdp, zero3 x
// tp} on 2x2 (4 ranks), each x {fp32, bf16, fp16} x accumulation {1, 4}, clipping on; fp32 and fp16 20 steps,
// bf16 6 (its matrix products are slow on CPUs without bf16 units); an fp16 run per layout with an inf
// gradient injected at step 3, and one bf16; the 16-bit runs at accumulation 4 reduce their gradients in fp32
// (DataParallelOptions::reduce_dtype).
void suite_matrix(const comm::BackendPtr& world) {
  const int64_t n = world->group_size();
  std::vector<Cell> layouts;
  if (n == 4) {
    layouts.push_back(Cell{"hsdp", 1, 2});
    layouts.push_back(Cell{"zero3", 2, 0});
  } else {
    for (const char* s : {"dp", "zero1", "zero2", "zero3"}) layouts.push_back(Cell{s, 1, 0});
    layouts.push_back(Cell{"dp", n, 0});
  }
  for (const Cell& layout : layouts) {
    for (auto precision : {optim::Precision::kFp32, optim::Precision::kBf16, optim::Precision::kFp16}) {
      for (int64_t acc : {1, 4}) {
        Cell c = layout;
        c.precision = precision;
        c.acc = acc;
        c.steps = precision == optim::Precision::kBf16 ? 6 : 20;
        c.reduce_fp32 = acc == 4 && precision != optim::Precision::kFp32;  // 16-bit gradients summed in fp32
        // an injected inf: fp16 at accumulation 1 on every layout, bf16 under dp
        if (acc == 1 && (precision == optim::Precision::kFp16 ||
                         (precision == optim::Precision::kBf16 && c.strategy == "dp" && c.tp == 1))) {
          c.inf_step = 3;
        }
        check_cell(world, c);
      }
    }
  }
}

}  // namespace dtrain::test
