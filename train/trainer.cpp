// The training loop; see trainer.h.
#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "checkpoint/file_io.h"
#include "checkpoint/training_state.h"
#include "comm/comm_log.h"
#include "comm/gather_text.h"
#include "comm/timeline.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/host_memory.h"
#include "dispatch/tensor_memory.h"
#include "optim/clip.h"
#include "optim/mixed_precision.h"
#include "parallel/data_parallel.h"
#include "parallel/parallelize.h"
#include "train/detail/trainer_log.h"
#include "train/schedule.h"
#include "train/solved_run.h"

namespace dtrain::train {

namespace {

using Clock = std::chrono::steady_clock;

int restart_count() {
  const char* v = std::getenv("DTRAIN_RESTART_COUNT");
  return v == nullptr ? 0 : std::atoi(v);
}

double rss_mib() { return process_memory_mib("VmRSS"); }

}  // namespace

int64_t deterministic_accumulation(int64_t batch, int64_t dp_ranks) {
  const int64_t k = std::max(kDeterministicMaxRanks, dp_ranks);
  if (batch % k != 0) {
    throw ValueError(str_cat(
        "train: --deterministic cuts the step's batch into ", k, " micro-batches of one size, so that ",
        k == kDeterministicMaxRanks ? "1, 2, 4 and 8" : str_cat("every power of 2 up to ", k),
        " data-parallel ranks sum the same tree, but --batch ", batch, " is not a multiple of ", k,
        ". Use --batch ", k, ", ", 2 * k, ", ", 3 * k,
        ", ... (the nearest: ", batch < k ? str_cat(k) : str_cat(batch / k * k, " or ", (batch / k + 1) * k),
        "), or give --accumulation yourself (the ranks times a power of 2, dividing --batch: the same bits "
        "then at the world sizes it allows)."));
  }
  return k;
}

void check_trainer_options(const TrainerOptions& o) {
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine" && o.lr_schedule != "linear") {
    throw ValueError(str_cat("train: --lr-schedule '", o.lr_schedule,
                             "' is not a schedule dtrain has. Use constant, cosine or linear."));
  }
  if (o.warmup_type != "linear" && o.warmup_type != "log") {
    throw ValueError(
        str_cat("train: the warmup type '", o.warmup_type, "' is not one dtrain has. Use linear or log."));
  }
  if (o.optimizer != "adamw") {
    throw ValueError(str_cat("train: the optimizer '", o.optimizer, "' is not one dtrain has. Use adamw."));
  }
  if (!std::isfinite(o.warmup_min_lr) || o.warmup_min_lr > o.lr) {
    throw ValueError(str_cat("train: --warmup-min-lr ", o.warmup_min_lr, " must be at most --lr (", o.lr,
                             "); a negative value means a line from 0."));
  }
  if (!(o.initial_scale_power >= 0 && o.initial_scale_power <= 100)) {
    throw ValueError(str_cat("train: --initial-scale-power ", o.initial_scale_power,
                             " must be between 0 and 100 (the first fp16 scale is 2^this), e.g. 16."));
  }
  o.scaler.validate();
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) {
    throw ValueError(str_cat("train: --lr ", o.lr,
                             " must be a learning rate of 0 or more (0: the weights stay), e.g. 1e-3."));
  }
  if (o.batch < 1 || o.steps < 1) {
    throw ValueError(str_cat("train: --batch ", o.batch, " and --steps ", o.steps, " must be positive."));
  }
  // (a warmup longer than the run is DeepSpeed's WarmupLR cut short; a decaying schedule needs its decay)
  if (o.warmup < 0 || (o.warmup > o.steps && o.lr_schedule != "constant")) {
    throw ValueError(
        str_cat("train: --warmup ", o.warmup, " must be between 0 and --steps (", o.steps, ")."));
  }
  if (!std::isfinite(o.min_lr) || o.min_lr > o.lr) {
    throw ValueError(str_cat("train: --min-lr ", o.min_lr, " must be at most --lr (", o.lr,
                             "); a negative value means lr / 10."));
  }
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) {
    throw ValueError(str_cat("train: --weight-decay ", o.weight_decay, " must be 0 or more, e.g. 0.1."));
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.eps > 0)) {
    throw ValueError(str_cat("train: AdamW's betas (", o.beta1, ", ", o.beta2,
                             ") must each be in [0, 1) and eps ", o.eps,
                             " positive, e.g. betas (0.9, 0.999) and eps 1e-8."));
  }
  if (o.log_every < 1) {
    throw ValueError(
        str_cat("train: --log-every ", o.log_every, " must be at least 1. Use e.g. --log-every 20."));
  }
  if (o.save_every < 0 || o.keep < 0) {
    throw ValueError(str_cat("train: --save-every ", o.save_every, " and --keep ", o.keep,
                             " must not be negative (0: save at the end only; keep all)."));
  }
  if (o.save_every > 0 && o.save.empty()) {
    throw ValueError("train: --save-every needs --save DIR (the folder the checkpoints go to).");
  }
  if (o.resume == "auto" && o.save.empty()) {
    throw ValueError(
        "train: --resume auto continues from the latest checkpoint under --save; add --save DIR.");
  }
  if (!o.resume.empty() && o.resume != "auto" && !o.init_from.empty()) {
    throw ValueError(str_cat("train: --resume ", o.resume, " and --init-from ", o.init_from,
                             " both set the weights. Use --resume to continue a run, --init-from to start a "
                             "new one from a safetensors file."));
  }
  if (o.accumulation < 1 || o.accumulation > o.batch) {
    throw ValueError(str_cat("train: --accumulation ", o.accumulation, " must be between 1 and --batch (",
                             o.batch, "): the global batch is split into that many micro-batches."));
  }
  if (!(o.clip >= 0) || !std::isfinite(o.clip)) {
    throw ValueError(str_cat("train: --clip ", o.clip,
                             " must be a positive gradient norm (or 0: no clipping). Use e.g. --clip 1.0."));
  }
  if (o.strategy == kSolveStrategy) {
    check_solve_options(o);
    return;
  }
  if (!o.solve_mesh.empty() || o.solve_budget != 0 || !o.solve_pins.empty()) {
    throw ValueError(
        str_cat("train: --solve-mesh, --solve-budget and --solve-pin are for --strategy solve, not ",
                o.strategy, ". Leave them out, or use --strategy solve."));
  }
  const parallel::Strategy strategy = parallel::parse_strategy(o.strategy);
  if (o.shard_size != 0 && strategy != parallel::Strategy::kHybridShard) {
    throw ValueError(str_cat("train: --shard-size ", o.shard_size, " is for --strategy hsdp only, not ",
                             o.strategy, ". Leave it out, or use --strategy hsdp."));
  }
  parallel::ParallelConfig pc;
  pc.strategy = o.strategy;
  pc.tp = o.tp;
  optim::MixedPrecision::check(optim::parse_precision(o.precision), pc);
  if (!o.reduce_dtype.empty()) optim::parse_precision(o.reduce_dtype);  // (a bad name: its message)
  if (!(o.loss_scale >= 0) || !std::isfinite(o.loss_scale)) {
    throw ValueError(str_cat("train: --loss-scale ", o.loss_scale,
                             " must be 0 (dynamic) or a positive static scale, e.g. 1024."));
  }
  if (o.loss_scale > 0 && optim::parse_precision(o.precision) != optim::Precision::kFp16) {
    throw ValueError(str_cat("train: --loss-scale ", o.loss_scale, " is for --precision fp16 (got ",
                             o.precision, "): bf16 and fp32 need no loss scale. Leave it out."));
  }
  if (o.tp_plan.sequence_parallel && o.tp == 1) {
    throw ValueError(
        "train: --sequence-parallel needs --tp of 2 or more (it splits the sequence over the "
        "tensor-parallel ranks). Add --tp, or leave it out.");
  }
  if (o.tokens_per_sample < 1) {
    throw ValueError(str_cat("train: tokens_per_sample ", o.tokens_per_sample, " must be at least 1."));
  }
}

Trainer::Trainer(torch::nn::Module& model, LossFn loss, BatchFn batches, TrainerOptions options,
                 comm::BackendPtr world)
    : model_(model),
      loss_(std::move(loss)),
      batches_(std::move(batches)),
      o_(std::move(options)),
      world_(std::move(world)) {
  check_trainer_options(o_);
  // tensor_peak_mib in the metrics (counting from here unless the caller installed it before the model)
  if (!o_.metrics.empty()) dispatch::install_tensor_memory_counter();
  if (!loss_ || !batches_) throw ValueError("Trainer: the loss function and the batch function must be set.");
  const int64_t ws = world_->group_size();
  if (o_.strategy == kSolveStrategy) {
    mp_ = std::make_unique<optim::MixedPrecision>(optim::Precision::kFp32, o_.scaler);
    at::manual_seed(o_.seed + static_cast<uint64_t>(world_->group_rank()));
    solved_ = std::make_unique<SolvedRun>(model_, loss_, batches_(1), o_, world_);
    if (lead()) {
      std::printf("%s", solved_->summary().c_str());
      std::fflush(stdout);
    }
    return;
  }
  if (o_.tp < 1 || ws % o_.tp != 0) {
    throw ValueError(str_cat("train: --tp ", o_.tp, " does not divide the world size ", ws,
                             ". Choose a divisor of ", ws, "."));
  }
  n_ = ws / o_.tp;
  parallel::ParallelConfig pc;
  pc.strategy = o_.strategy;
  pc.shard_size = o_.shard_size;
  pc.tp = o_.tp;
  pc.tp_plan = o_.tp_plan;
  pc.reduction = parallel::with_horovod_env({});
  if (o_.bucket_bytes > 0) pc.reduction.bucket_bytes = o_.bucket_bytes;
  pc.reduction.deterministic = o_.deterministic;
  pc.activation_checkpointing = o_.activation_checkpointing;
  pc.mesh_order = parallel::parse_mesh_order(o_.mesh_order);
  if (!o_.reduce_dtype.empty()) {
    pc.reduction.reduce_dtype = optim::compute_dtype(optim::parse_precision(o_.reduce_dtype));
  }
  const parallel::Strategy strategy = parallel::validate_parallel_config(pc, ws);
  if (!o_.deterministic && o_.batch / o_.accumulation < n_) {  // (deterministic: whole micro-batches a rank)
    throw ValueError(str_cat("train: --batch ", o_.batch, " in ", o_.accumulation, " micro-batches gives ",
                             o_.batch / o_.accumulation, " samples per micro-batch, fewer than the ", n_,
                             " data-parallel ranks; each needs at least one. Use --batch of at least ",
                             n_ * o_.accumulation, "."));
  }
  if (o_.deterministic) {
    const int64_t c = o_.accumulation / n_;
    if (o_.batch % o_.accumulation != 0 || o_.accumulation % n_ != 0 || (c & (c - 1)) != 0) {
      throw ValueError(str_cat(
          "train: --deterministic cuts --batch ", o_.batch, " into --accumulation ", o_.accumulation,
          " micro-batches of one size, spread evenly over the ", n_,
          " data-parallel ranks, a power of 2 on each: --accumulation must divide --batch and be the ranks "
          "times 1, 2, 4, ... (e.g. --accumulation ",
          n_ * 4, " with --batch a multiple of it), or leave --accumulation out: dtrain train then chooses ",
          "one that gives the same bits at 1, 2, 4 and 8 ranks."));
    }
    // Reductions split over threads sum in another order: the same bits at every world size need the same
    // thread count on every rank, whatever the launcher gave each (cores / ranks).
    if (const int threads = at::get_num_threads(); threads != 1) {
      // (the variables too: a BLAS that reads its own at its first call, e.g. MKL, then agrees)
      for (const char* v : {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
        ::setenv(v, "1", 1);
      at::set_num_threads(1);
      if (lead()) {
        std::printf(
            "dtrain train: deterministic: intra-op threads pinned to 1 (were %d): a thread count that "
            "differs "
            "between world sizes would change the order of sums\n",
            threads);
        std::fflush(stdout);
      }
    }
  }
  const optim::Precision precision = optim::parse_precision(o_.precision);
  // Under dp alone the step's loss (and each rank's memory) travels with the last gradient bucket (fp32
  // buckets only: not through a 16-bit one); otherwise one all-reduce on the steps that need it.
  loss_rides_ = strategy == parallel::Strategy::kDataParallel && o_.tp == 1 && !o_.deterministic &&
                (pc.reduction.reduce_dtype ? *pc.reduction.reduce_dtype == at::kFloat
                                           : precision == optim::Precision::kFp32);
  if (loss_rides_) pc.reduction.side_values = 3 + 2 * ws;  // run_step's values
  optim::LossScalerOptions scaler = o_.scaler;
  scaler.initial_scale = std::pow(2.0, o_.initial_scale_power);
  if (o_.loss_scale > 0) {
    scaler.dynamic = false;
    scaler.initial_scale = o_.loss_scale;
  }
  mp_ = std::make_unique<optim::MixedPrecision>(precision, scaler);
  const auto adamw =
      torch::optim::AdamWOptions(o_.lr).weight_decay(o_.weight_decay).betas({o_.beta1, o_.beta2}).eps(o_.eps);
  par_ = parallel::parallelize(model_, world_, pc, mp_->wrap([adamw](std::vector<at::Tensor> tensors) {
    return std::make_unique<torch::optim::AdamW>(tensors, adamw);
  }));
  me_ = par_->data_parallel_group()->group_rank();  // (its rows of each batch; the mesh order decides)
  if (!loss_rides_ || par_->data_parallel() == nullptr) loss_rides_ = false;
  state_ = std::make_unique<checkpoint::TrainingState>(model_, *par_, mp_.get());
  // libtorch's default generator (dropout, the user's own draws): seeded from the seed and the rank, so that
  // a run repeats; a resumed run restores each rank's state from the checkpoint instead
  at::manual_seed(o_.seed + static_cast<uint64_t>(world_->group_rank()));
  resume_or_import();
}

Trainer::~Trainer() = default;

parallel::Parallelized& Trainer::parallelized() {
  if (!par_) {
    throw ValueError(
        "Trainer: --strategy solve lays the module out by the solver's plan, not by parallelize(): there is "
        "no Parallelized to give. Use solved_run().");
  }
  return *par_;
}

bool Trainer::lead() const { return world_->group_rank() == 0; }

// --resume as given; under "auto", and in a group the launcher restarted (DTRAIN_RESTART_COUNT >= 1) with
// --save and no --resume, the latest checkpoint under --save if there is one, else a fresh start (or
// --init-from's weights).
void Trainer::resume_or_import() {
  std::string resume = o_.resume;
  const bool restarted = restart_count() > 0;
  if (o_.resume == "auto" || (o_.resume.empty() && restarted && !o_.save.empty())) {
    const bool have = std::filesystem::exists(std::filesystem::path(o_.save) / "latest");
    if (lead()) {
      const std::string why =
          restarted ? str_cat("restart ", restart_count(), " of the group") : std::string("--resume auto");
      std::printf(have ? "dtrain train: %s: resuming from the latest checkpoint under %s\n"
                       : "dtrain train: %s: no checkpoint under %s yet, starting at step 1\n",
                  why.c_str(), o_.save.c_str());
    }
    resume = have ? o_.save : "";
  }
  if (!o_.init_from.empty() && resume.empty()) {
    state_->import_weights(o_.init_from);
    if (lead()) std::printf("dtrain train: weights imported from %s\n", o_.init_from.c_str());
  }
  if (resume.empty()) return;
  const auto t0 = Clock::now();
  const checkpoint::Resumed r = state_->load(resume);
  first_step_ = r.step + 1;
  resumed_meta = r.meta;
  if (lead()) {
    std::printf("dtrain train: resumed from %s (step %ld) in %.2f s; random state %s\n", r.dir.c_str(),
                static_cast<long>(r.step), std::chrono::duration<double>(Clock::now() - t0).count(),
                r.rng_restored ? "restored" : "not restored (saved at another world size)");
    if (r.meta.value("seed", o_.seed) != o_.seed || r.meta.value("batch", o_.batch) != o_.batch) {
      std::printf(
          "dtrain train: note: the checkpoint's run drew its batches with seed %ld and batch %ld; this run "
          "uses "
          "seed %ld and batch %ld, so its batches from here on differ\n",
          static_cast<long>(r.meta.value("seed", o_.seed)),
          static_cast<long>(r.meta.value("batch", o_.batch)), static_cast<long>(o_.seed),
          static_cast<long>(o_.batch));
    }
  }
  std::fflush(stdout);
}

void Trainer::add_callback(std::shared_ptr<Callback> cb) { callbacks_.push_back(std::move(cb)); }

void Trainer::set_evaluation(BatchFn eval, int64_t batches, int64_t every) {
  if (batches < 1 || batches > 100000 || every < 0) {
    throw ValueError(str_cat("train: --eval-batches ", batches,
                             " must be between 1 and 100000 and the evaluation "
                             "interval ",
                             every, " 0 (at the end only) or more."));
  }
  eval_ = std::move(eval);
  eval_batches_ = batches;
  eval_every_ = every;
}

std::string Trainer::save(int64_t step, const std::string& root) {
  const auto t0 = Clock::now();
  nlohmann::json meta = checkpoint_meta.is_object() ? checkpoint_meta : nlohmann::json::object();
  meta["seed"] = o_.seed;
  meta["batch"] = o_.batch;
  const std::string dir = state_->save(root.empty() ? o_.save : root, step, meta, o_.keep);
  if (lead()) {
    if (detail::progress_bar()) std::printf("\033[K");  // (over the bar)
    std::printf("dtrain train: checkpoint of step %ld saved to %s in %.2f s\n", static_cast<long>(step),
                dir.c_str(), std::chrono::duration<double>(Clock::now() - t0).count());
    std::fflush(stdout);
  }
  for (auto& cb : callbacks_) cb->on_checkpoint(*this, step, dir);
  return dir;
}

double Trainer::evaluate(const BatchFn& eval, int64_t batches) {
  at::NoGradGuard no_grad;
  const bool was_training = model_.is_training();
  model_.eval();
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) sum += loss_(eval(b)).item<double>();
  if (was_training) model_.train();
  return sum / static_cast<double>(batches);
}

void Trainer::run_step(int64_t step, StepInfo& info, bool want_loss, Log& log) {
  comm::timeline::take_wait_seconds();  // (from here: this step's)
  const Batch global = batches_(step);
  if (global.empty())
    throw ValueError(str_cat("Trainer: the batch function gave no tensor for step ", step, "."));
  for (size_t i = 0; i < global.size(); ++i) {
    if (global[i].dim() < 1 || global[i].size(0) != o_.batch) {
      throw ValueError(str_cat("Trainer: tensor ", i, " of step ", step, "'s batch has shape ",
                               global[i].sizes(), "; its dim 0 must be the batch, ", o_.batch, " samples."));
    }
  }
  if (solved_) {
    run_solved_step(step, global, info, want_loss, log);
    return;
  }
  const int64_t ws = world_->group_size();
  par_->zero_grad();
  double share = 0;  // this rank's part of the global mean loss
  // [0]: the loss; [1 + r]: rank r's resident memory (MiB); [1 + ws], [2 + ws]: rank 0's Log::lead_values
  at::Tensor values;
  // deterministic: micro-batches of a fixed size, rank r taking micro-batches r*c .. r*c + c - 1, each loss
  // scaled by 1/K (the engine sums); otherwise each rank its rows of every micro-batch, averaged over ranks
  const int64_t c = o_.deterministic ? o_.accumulation / n_ : o_.accumulation;
  for (int64_t k = 0; k < c; ++k) {
    const Range micro = balanced_part(o_.batch, o_.accumulation, o_.deterministic ? me_ * c + k : k);
    const Range mine = o_.deterministic ? Range{0, micro.count} : balanced_part(micro.count, n_, me_);
    Batch rows;
    for (const auto& t : global) rows.push_back(t.narrow(0, micro.start + mine.start, mine.count));
    const bool last = k == c - 1;
    par_->set_requires_gradient_sync(last);
    at::Tensor loss;
    {
      comm::timeline::Span span("forward");
      loss = loss_(rows);
    }
    const double weight = static_cast<double>(mine.count) / static_cast<double>(o_.batch);
    share += loss.item<double>() * weight;
    if (last) {
      values = at::zeros({3 + 2 * ws}, at::kDouble);
      values[0] = share;
      if (want_loss) values[1 + world_->group_rank()] = rss_mib();  // (a read of /proc: logged steps only)
      const std::array<double, 2> lead = log.lead_values(step);
      values[1 + ws] = lead[0];
      values[2 + ws] = lead[1];
      if (loss_rides_) par_->data_parallel()->reduce_with_gradients(values);  // rides with the gradients
    }
    // (16-bit: the loss scaled in fp32, so that the scale itself cannot overflow the format)
    comm::timeline::Span span("backward");
    (loss.to(at::kFloat) * (weight * static_cast<double>(o_.deterministic ? 1 : n_) * mp_->loss_scale()))
        .backward();
  }
  auto optimizer_span = std::make_unique<comm::timeline::Span>("optimizer");
  info.lr = scheduled_lr(o_, step);
  for (auto& g : par_->optimizer().param_groups()) g.options().set_lr(info.lr);
  const bool take = mp_->unscale(*par_);  // 16-bit: into the fp32 masters; false for an inf or nan
  info.skipped = !take;
  info.grad_norm = take && o_.clip > 0 ? optim::clip_grad_norm(*par_, o_.clip) : -1.0;
  if (take) {
    par_->step([&] { mp_->copy_back(); });
  } else {
    par_->zero_grad();
  }
  optimizer_span.reset();
  info.loss = std::numeric_limits<double>::quiet_NaN();
  // tensor_peak_mib: this rank's peak over the whole step, backward and optimizer included, so read now: in
  // the loss's all-reduce, or, where the loss rode with the gradients, in one small all-reduce of its own
  const bool peaks = want_loss && dispatch::tensor_memory_counter_installed();
  if (peaks) {
    const double mine = static_cast<double>(dispatch::tensor_bytes_peak()) / (1 << 20);
    if (!loss_rides_) {
      values[3 + ws + world_->group_rank()] = mine;
    } else {
      at::Tensor each = at::zeros({ws}, at::kDouble);
      each[world_->group_rank()] = mine;
      world_->all_reduce(each)->wait();
      values.narrow(0, 3 + ws, ws).copy_(each);
    }
  }
  if (want_loss || loss_rides_) {  // (riding, every step's loss is known at no cost)
    if (!loss_rides_) {
      comm::timeline::Span loss_span("loss for the log", "comm");
      world_->all_reduce(values)->wait();
    }
    info.loss = values[0].item<double>() / static_cast<double>(o_.tp);  // a tp group's ranks: the same share
    const auto* v = values.data_ptr<double>();
    log.agree(step, v[1 + ws], v[2 + ws]);
  }
  last_rss_.assign(values.data_ptr<double>() + 1, values.data_ptr<double>() + 1 + ws);
  last_tensor_peak_.clear();
  if (peaks) {
    last_tensor_peak_.assign(values.data_ptr<double>() + 3 + ws, values.data_ptr<double>() + 3 + 2 * ws);
    dispatch::reset_tensor_peak();  // the next record's peak: from what is live after this step
  }
  if (!want_loss) last_rss_.clear();
  info.comm_wait_s = comm::timeline::take_wait_seconds();
}

// A step under strategy solve: the solved run takes the whole global batch (every rank has it; each places
// its part as the plan says) and gives the global loss on every rank.
void Trainer::run_solved_step(int64_t step, const Batch& global, StepInfo& info, bool want_loss, Log& log) {
  if (o_.batch % o_.accumulation != 0) {
    throw ValueError(str_cat("train: --strategy solve needs --batch ", o_.batch,
                             " to be a multiple of --accumulation ", o_.accumulation,
                             ": the step was recorded with micro-batches of one size."));
  }
  const int64_t ws = world_->group_size();
  info.lr = scheduled_lr(o_, step);
  double norm = -1;
  double loss = 0;
  {
    comm::timeline::Span span("solved step");
    loss = solved_->step(global, info.lr, &norm);
  }
  info.grad_norm = o_.clip > 0 ? norm : -1.0;
  info.skipped = false;
  info.loss = loss;  // (known on every rank: the step's own collectives gathered it)
  at::Tensor values = at::zeros({3 + 2 * ws}, at::kDouble);
  const bool peaks = want_loss && dispatch::tensor_memory_counter_installed();
  if (want_loss) {
    values[1 + world_->group_rank()] = rss_mib();
    const std::array<double, 2> lead = log.lead_values(step);
    values[1 + ws] = lead[0];
    values[2 + ws] = lead[1];
    if (peaks)
      values[3 + ws + world_->group_rank()] = static_cast<double>(dispatch::tensor_bytes_peak()) / (1 << 20);
    world_->all_reduce(values)->wait();
    const auto* v = values.data_ptr<double>();
    log.agree(step, v[1 + ws], v[2 + ws]);
    last_rss_.assign(v + 1, v + 1 + ws);
  } else {
    last_rss_.clear();
  }
  last_tensor_peak_.clear();
  if (peaks) {
    last_tensor_peak_.assign(values.data_ptr<double>() + 3 + ws, values.data_ptr<double>() + 3 + 2 * ws);
    dispatch::reset_tensor_peak();
  }
  info.comm_wait_s = comm::timeline::take_wait_seconds();
}

void Trainer::write_timeline() {
  const std::vector<comm::timeline::Event> mine = comm::timeline::take();
  comm::timeline::enable(false);
  const std::vector<std::string> all = comm::all_gather_text(world_, comm::timeline::events_json(mine));
  if (!lead()) return;
  std::vector<std::vector<comm::timeline::Event>> ranks;
  size_t events = 0;
  for (const auto& text : all) {
    ranks.push_back(comm::timeline::events_from_json(text));
    events += ranks.back().size();
  }
  checkpoint::write_file_atomic(o_.timeline, comm::timeline::chrome_trace(ranks));
  std::printf(
      "dtrain train: timeline of %zu events on %zu ranks written to %s (open it in Perfetto or "
      "chrome://tracing)\n",
      events, ranks.size(), o_.timeline.c_str());
  std::fflush(stdout);
}

void Trainer::fit() {
  try {
    for (auto& cb : callbacks_) cb->on_train_start(*this);
    Log log(o_, lead(), first_step_);
    if (!o_.timeline.empty()) {
      if (lead()) {  // a path that cannot be written fails now, not after the training
        std::ofstream f(o_.timeline, std::ios::app);
        if (!f) {
          throw ValueError(
              str_cat("train: --timeline ", o_.timeline,
                      " cannot be written. Name a file in a folder that exists and is writable."));
        }
      }
      comm::timeline::take();
      comm::timeline::enable(true);
    }
    dispatch::reset_tensor_peak();  // tensor_peak_mib counts the steps, not the set-up before them
    for (int64_t step = first_step_; step <= o_.steps; ++step) {
      fault_point("step", step);
      comm::CommLog::instance().clear();  // the log then holds one step
      bool want = log.wants(step);
      for (auto& cb : callbacks_) want = cb->wants_loss(step) || want;
      StepInfo info;
      info.step = step;
      {
        comm::timeline::Span span("step");
        run_step(step, info, want, log);
      }
      info.seconds = log.seconds();
      if (step == o_.steps) last_step_comm_ = comm::CommLog::instance().summary();
      if (want) {
        if (step == first_step_) first_loss_ = info.loss;
        last_loss_ = info.loss;
      }
      log.step(info, last_rss_, last_tensor_peak_, mp_->loss_scale());
      for (auto& cb : callbacks_) cb->on_step_end(*this, info);
      if (!o_.save.empty() && ((o_.save_every > 0 && step % o_.save_every == 0) || step == o_.steps))
        save(step);
      if (eval_ && eval_every_ > 0 && step % eval_every_ == 0 && step != o_.steps) {
        const double v = evaluate(eval_, eval_batches_);
        log.evaluation(step, v);
        for (auto& cb : callbacks_) cb->on_evaluate(*this, step, v);
      }
    }
    // a resumed run with no step left saves what it loaded under its own layout: a conversion between layouts
    if (!o_.save.empty() && first_step_ > o_.steps) save(first_step_ - 1);
    if (eval_) {
      const int64_t step = std::max(o_.steps, first_step_ - 1);
      const double v = evaluate(eval_, eval_batches_);
      log.evaluation(step, v);
      for (auto& cb : callbacks_) cb->on_evaluate(*this, step, v);
    }
    if (!o_.timeline.empty()) write_timeline();
    for (auto& cb : callbacks_) cb->on_train_end(*this);
  } catch (const std::exception& e) {
    comm::timeline::enable(false);
    for (auto& cb : callbacks_) cb->on_exception(*this, e);
    throw;
  }
}

}  // namespace dtrain::train
