// The data-parallel suites (see worker_suites.h): parallel::DataParallel on an unmodified models::GPT, each
// rank on its (uneven) rows, against the same model trained on the whole batch in this process with plain
// libtorch; its communication from CommLog; its errors; its memory report.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "comm/work.h"
#include "core/balanced_split.h"
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

// A plain copy of a parameter (ZeRO-3's are gathered: a collective every rank runs alike).
at::Tensor materialize_copy(const at::Tensor& t) { return t.detach().clone(); }

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
      Range micro = balanced_part(B, accumulation, k);
      Range mine = balanced_part(micro.count, n, me);
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

// Counts the bytes libtorch's CPU allocator has handed out and not taken back, and their peak (installed
// once, for the rest of the process; it allocates as libtorch's default CPU allocator does, with
// c10::alloc_cpu).
class CountingAllocator : public c10::Allocator {
 public:
  static CountingAllocator& install() {
    static CountingAllocator* a = [] {
      auto* c = new CountingAllocator();
      c10::SetCPUAllocator(c, /*priority=*/255);
      return c;
    }();
    return *a;
  }
  // From now on, the peak counts from what is live now.
  void reset_peak() { peak_ = live_.load(); }
  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }

  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = static_cast<int64_t>(n);
    }
    const int64_t now = live_ += static_cast<int64_t>(n);
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return c10::DataPtr(p, p, &release, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  CountingAllocator() = default;
  static CountingAllocator& self() { return install(); }
  static void release(void* p) {
    CountingAllocator& a = self();
    int64_t n = 0;
    {
      std::lock_guard<std::mutex> lock(a.mu_);
      auto it = a.sizes_.find(p);
      if (it != a.sizes_.end()) {
        n = it->second;
        a.sizes_.erase(it);
      }
    }
    a.live_ -= n;
    c10::free_cpu(p);
  }
  std::mutex mu_;
  std::unordered_map<void*, int64_t> sizes_;  // guarded by mu_
  std::atomic<int64_t> live_{0}, peak_{0};
};

// ZeRO-3 from the meta device: the GPT built under OnMetaDevice holds no memory; Zero makes each parameter
// whole one at a time (models::GPTInit) and keeps this rank's shard, so the set-up's peak stays near the
// shards, below the whole model's bytes (which building it on the CPU reaches); the values are the ones the
// constructor gives.
void check_meta_init(const comm::BackendPtr& world) {
  const int64_t n = world->group_size();
  const models::GPTConfig cfg = small_gpt(64);
  CountingAllocator& counter = CountingAllocator::install();
  int64_t model_bytes = 0, largest = 0;
  counter.reset_peak();
  int64_t before = counter.live();
  models::GPT ref(cfg);
  for (const auto& p : ref->parameters()) {
    model_bytes += p.numel() * p.element_size();
    largest = std::max<int64_t>(largest, p.numel() * p.element_size());
  }
  check_true(str_cat("meta init: building on the CPU peaks at the model's bytes or more (",
                     counter.peak() - before, " vs ", model_bytes, "): the counter sees allocations"),
             counter.peak() - before >= model_bytes);
  counter.reset_peak();
  before = counter.live();
  models::GPT gpt{nullptr};
  {
    parallel::OnMetaDevice meta;
    gpt = models::GPT(cfg);
  }
  check_true(
      str_cat("meta init: the module on the meta device holds no memory (", counter.live() - before, ")"),
      counter.peak() - before < 4096);
  for (const auto& p : gpt->parameters())
    check_true("meta init: a parameter on the meta device", p.is_meta());
  parallel::ZeroOptions o;
  o.bucket_bytes = 32 << 10;
  models::GPTInit init(cfg.seed);
  o.materialize = [&](const std::string& name, at::Tensor& t) { init(name, t); };
  auto zero = std::make_unique<parallel::Zero>(
      *gpt, world, 3,
      [](std::vector<at::Tensor> shards) {
        return std::make_unique<torch::optim::AdamW>(shards, torch::optim::AdamWOptions(1e-3));
      },
      o);
  const int64_t setup_peak = counter.peak() - before, shards = zero->memory().parameters;
  // the shards, one whole parameter at a time (and its broadcast), and small bookkeeping
  const int64_t bound = shards + 2 * largest + (32 << 10);
  check_true(str_cat("meta init at ", n, " ranks: the set-up peaks at ", setup_peak, " bytes, within ", bound,
                     " (shards ", shards, ", largest parameter ", largest, ", model ", model_bytes, ")"),
             setup_peak <= bound && (n == 1 || setup_peak < model_bytes));
  std::string refused;
  try {
    gpt->to(at::kDouble);  // would leave the shards training while the module reads copies
  } catch (const ValueError& e) {
    refused = e.what();
  }
  check_true(str_cat("ZeRO-3: Module::to() on its parameters is refused with a message (", refused, ")"),
             refused.find("cannot be replaced") != std::string::npos);
  auto mine = gpt->named_parameters(), theirs = ref->named_parameters();
  for (const auto& item : theirs) {
    check_equal(str_cat("meta init: ", item.key(), " as the constructor makes it"),
                materialize_copy(mine[item.key()]), item.value().detach());
  }
  // Writes into ZeRO-3 parameters keep their values in the shards, also when the op reads a parameter of
  // another unit (gathering it may let the written one's unit go).
  {
    at::NoGradGuard no_grad;
    mine["h0.attn.q.weight"].copy_(mine["h1.mlp.proj.weight"].narrow(1, 0, 64));
    mine["ln_f.bias"].fill_(0.5);
  }
  check_equal("ZeRO-3: a parameter written from another unit's", materialize_copy(mine["h0.attn.q.weight"]),
              theirs["h1.mlp.proj.weight"].detach().narrow(1, 0, 64));
  check_equal("ZeRO-3: a parameter filled", materialize_copy(mine["ln_f.bias"]), at::full({64}, 0.5));
}

// Peak memory while training, at 4 ranks: the same GPT (float32, AdamW), two steps under data parallel and
// under ZeRO-3, counted from before the model was built. Model state is 16Ψ bytes under data parallel and
// 16Ψ/N under ZeRO-3, the rest (activations, the batch) the same, so ZeRO-3's peak is lower by 16Ψ(1 - 1/N)
// less what it holds for a moment: the gathered units (in use, prefetched, pinned) and the gradient buckets
// awaiting their reduce-scatter, each with the collective's padded copy; here a few tens of units of 32 KiB
// against a 0.4 MiB model, so the test asks for at least half of 16Ψ(1 - 1/N).
void check_peak_memory(const comm::BackendPtr& world) {
  const int64_t n = world->group_size(), me = world->group_rank();
  if (n != 4) return;
  const models::GPTConfig cfg = small_gpt(64);
  CountingAllocator& counter = CountingAllocator::install();
  const int64_t unit = 32 << 10;
  auto adamw = [](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
  };
  int64_t psi_bytes = 0;
  auto run = [&](int stage) {
    const int64_t base = counter.live();
    models::GPT gpt(cfg);
    psi_bytes = param_bytes(*gpt);
    parallel::DataParallelOptions o;
    o.bucket_bytes = unit;
    std::unique_ptr<parallel::DataParallel> dp;
    std::unique_ptr<parallel::Zero> zero;
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (stage == 0) {
      dp = std::make_unique<parallel::DataParallel>(*gpt, world, o);
      opt = adamw(gpt->parameters());
    } else {
      zero = std::make_unique<parallel::Zero>(*gpt, world, 3, adamw, o);
    }
    counter.reset_peak();
    for (int64_t step = 1; step <= 2; ++step) {
      at::Tensor w = windows(8 * n, cfg, step);
      at::Tensor rows = w.narrow(0, 8 * me, 8);
      dp ? opt->zero_grad() : zero->zero_grad();
      gpt->loss(rows.narrow(1, 0, cfg.block_size).contiguous(),
                rows.narrow(1, 1, cfg.block_size).contiguous())
          .backward();
      if (dp) {
        opt->step();
      } else {
        zero->step();
      }
    }
    return counter.peak() - base;
  };
  // ZeRO-3 first: what a run leaves for the collective engines to free later can only lower the second run's
  // peak, data parallel's, against this test.
  const int64_t peak_z3 = run(3), peak_dp = run(0);
  const int64_t expected = 4 * psi_bytes - 4 * psi_bytes / n;
  check_true(str_cat("peak memory at ", n, " ranks: data parallel ", peak_dp, " bytes, ZeRO-3 ", peak_z3,
                     ": lower by ", peak_dp - peak_z3, ", 16Ψ(1 - 1/N) = ", expected,
                     " less what is held for a moment; at least half of it expected"),
             2 * (peak_dp - peak_z3) >= expected);
  if (me == 0) {
    std::fprintf(stderr, "peak memory at %ld ranks: dp %ld, zero3 %ld, margin %ld, 16psi(1-1/N) %ld\n",
                 static_cast<long>(n), static_cast<long>(peak_dp), static_cast<long>(peak_z3),
                 static_cast<long>(peak_dp - peak_z3), static_cast<long>(expected));
  }
}

void suite_zero(const comm::BackendPtr& world) {
  for (int stage : {1, 2, 3}) {
    check_parity(world, stage, 1, int64_t{25} << 20);
    check_parity(world, stage, 4, 16 << 10);
  }
  check_meta_init(world);
  check_peak_memory(world);
}

// hsdp on a [2, 2] mesh: ZeRO-3 within pairs of ranks, replicated across the pairs.
void suite_hsdp(const comm::BackendPtr& world) {
  if (world->group_size() != 4) throw ValueError("suite hsdp needs 4 ranks");
  check_parity(world, 3, 1, int64_t{25} << 20, 2);
  check_parity(world, 3, 4, 16 << 10, 2);
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
  at::Tensor w = windows(rows * n, cfg, 1).narrow(0, rows * me, rows);
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
  tensor::CommLog::instance().clear();
  backward(true);
  const int64_t k = tensor::CommLog::instance().totals().collectives;
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
