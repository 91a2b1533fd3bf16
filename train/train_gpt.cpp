// The training run; see train_gpt.h.
#include "train/train_gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/training_state.h"
#include "comm/init.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "optim/clip.h"
#include "optim/mixed_precision.h"
#include "parallel/data_parallel.h"
#include "parallel/parallelize.h"
#include "parallel/strategy.h"
#include "tensor/comm_log.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"
#include "train/text_data.h"

namespace dtrain::train {

using namespace dtrain::tensor;

parallel::TensorParallelPlan gpt_tensor_parallel_plan(const models::GPTConfig& c, bool sequence_parallel) {
  using namespace dtrain::parallel;
  const int64_t hd = c.n_embd / c.n_head;
  TensorParallelPlan plan;
  plan.styles = {{"wte", VocabParallel()},
                 {"h*.attn.q", ColwiseParallel(hd)},
                 {"h*.attn.k", ColwiseParallel(hd)},
                 {"h*.attn.v", ColwiseParallel(hd)},
                 {"h*.attn.proj", RowwiseParallel(hd)},
                 {"h*.mlp.fc", ColwiseParallel()},
                 {"h*.mlp.proj", RowwiseParallel()}};
  if (sequence_parallel) {
    plan.sequence_parallel = true;
    for (const char* m : {"wpe", "h*.ln1", "h*.ln2", "ln_f"}) plan.styles.emplace_back(m, SequenceParallel());
  }
  return plan;
}

Placement gpt_tp_placement(const std::string& name) {
  const auto dot = name.rfind('.');
  const std::string module = name.substr(0, dot), param = name.substr(dot + 1);
  for (const auto& [pattern, style] : gpt_tensor_parallel_plan(models::GPTConfig{}, false).styles) {
    if (!parallel::tp_pattern_matches(pattern, module)) continue;
    if (style.kind == parallel::TPStyle::Kind::kColwise) return Shard(0);
    if (style.kind == parallel::TPStyle::Kind::kRowwise && param == "weight") return Shard(1);
  }
  return Replicate();
}

namespace {

// Rank 0's view of the run: the loss lines every --log-every steps, and with --metrics one JSON object per
// step (step, loss, lr, elapsed_s, tokens_per_s, grad_norm with --clip) written and flushed as it comes.
class StepLog {
 public:
  StepLog(const TrainOptions& o, bool lead, int64_t tokens_per_step, int64_t first_step)
      : o_(o),
        lead_(lead),
        tokens_per_step_(tokens_per_step),
        first_step_(first_step),
        t0_(std::chrono::steady_clock::now()) {
    if (lead_ && !o.metrics.empty()) {
      metrics_.open(o.metrics, std::ios::trunc);
      if (!metrics_) {
        throw ValueError(str_cat("train: --metrics ", o.metrics,
                                 " cannot be written. Name a file in a folder that exists and is writable."));
      }
    }
  }
  // Whether step `step` needs the global loss.
  bool wants(int64_t step) const {
    return !o_.metrics.empty() || step == first_step_ || step % o_.log_every == 0 || step == o_.steps;
  }
  // grad_norm: the global gradient norm before clipping (with --clip), else negative.
  void step(int64_t step, double loss, double grad_norm, double lr) {
    if (step == first_step_) first_loss = loss;
    last_loss = loss;
    if (!lead_) return;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    double rate = static_cast<double>((step - first_step_ + 1) * tokens_per_step_) / secs;
    if (metrics_.is_open()) {
      nlohmann::json j{
          {"step", step}, {"loss", loss}, {"lr", lr}, {"elapsed_s", secs}, {"tokens_per_s", rate}};
      if (grad_norm >= 0) j["grad_norm"] = grad_norm;
      metrics_ << j.dump() << "\n";
      metrics_.flush();
    }
    if (step == first_step_ || step % o_.log_every == 0 || step == o_.steps) {
      std::printf("step %5ld  loss %.4f  lr %.2e  %.0f tokens/s%s\n", static_cast<long>(step), loss, lr, rate,
                  grad_norm >= 0 ? str_cat("  grad norm ", grad_norm).c_str() : "");
      std::fflush(stdout);
    }
  }
  double first_loss = 0, last_loss = 0;

 private:
  const TrainOptions& o_;
  bool lead_;
  int64_t tokens_per_step_;
  int64_t first_step_;
  std::chrono::steady_clock::time_point t0_;
  std::ofstream metrics_;
};

// This process's peak resident set (VmHWM), in MiB; 0 where /proc does not say.
double g_rss_before_model_mib =
    0;  // peak resident memory once the ranks connected, before the corpus and model

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0;
}

void print_end(const TrainOptions& o, const StepLog& log, double val, const std::string& last_step_comm,
               int64_t first_step) {
  if (first_step > o.steps) {
    std::printf(
        "dtrain train: no step left to run (resumed at step %ld, --steps %ld); validation loss %.4f\n",
        static_cast<long>(first_step - 1), static_cast<long>(o.steps), val);
  } else {
    std::printf(
        "dtrain train: loss %.4f -> %.4f over steps %ld..%ld; validation loss %.4f (uniform guess: %.4f)\n",
        log.first_loss, log.last_loss, static_cast<long>(first_step), static_cast<long>(o.steps), val,
        std::log(256.0));
  }
  std::printf("communication of the last step (forward, backward, AdamW), by the op that caused it:\n%s",
              last_step_comm.empty() ? "  none\n" : last_step_comm.c_str());
}

// Text from the trained model: `o.sample_bytes` bytes after `o.sample_prompt`, each drawn from the top_k
// likeliest next bytes at temperature 0.8 by a generator seeded with o.seed. Every rank runs the same
// forwards (ZeRO-3 gathers its units in them) and draws the same bytes; rank 0 prints them. Bytes that are
// not printable ASCII (nor newline or tab) print as '?'.
std::string generate(models::GPT& gpt, const TrainOptions& o, int64_t T) {
  at::NoGradGuard no_grad;
  const bool was_training = gpt->is_training();
  gpt->eval();
  std::vector<int64_t> tokens;
  for (unsigned char c : o.sample_prompt) tokens.push_back(c);
  if (tokens.empty()) tokens.push_back('\n');
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::string text = o.sample_prompt;
  for (int64_t i = 0; i < o.sample_bytes; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - T);
    const at::Tensor context =
        at::tensor(std::vector<int64_t>(tokens.begin() + start, tokens.end()), at::kLong).unsqueeze(0);
    at::Tensor logits = gpt->forward(context);
    if (tensor::is_dtensor(logits)) logits = tensor::full_tensor(logits);
    const at::Tensor last = logits.select(0, 0).select(0, -1).to(at::kFloat);
    const auto [values, ids] = last.topk(std::min<int64_t>(o.top_k, last.size(0)));
    const at::Tensor probs = at::softmax(values / 0.8, 0);
    const int64_t next = ids[at::multinomial(probs, 1, false, gen).item<int64_t>()].item<int64_t>();
    tokens.push_back(next);
    const bool shown = (next >= 32 && next < 127) || next == '\n' || next == '\t';
    text.push_back(shown ? static_cast<char>(next) : '?');
  }
  if (was_training) gpt->train();
  return text;
}

// The model under parallel::parallelize: each data-parallel rank takes its rows of each micro-batch (the
// ranks of a tensor-parallel group the same rows); under dp, parallel::DataParallel all-reduces the gradient
// buckets during the last micro-step's backward.
void train_parallel(const TrainOptions& o, const comm::BackendPtr& world, models::GPT& gpt,
                    const TextCorpus& corpus, const models::GPTConfig& cfg, int zero_stage) {
  const int64_t n = world->group_size() / o.tp, me = world->group_rank() / o.tp;  // data-parallel rank
  parallel::DataParallelOptions dpo = parallel::with_horovod_env({});
  if (o.bucket_bytes > 0) dpo.bucket_bytes = o.bucket_bytes;
  const auto adamw = torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay);
  // dp: AdamW over the whole model; zero1-3, hsdp: over this rank's shards.
  parallel::ParallelConfig pc;
  pc.strategy = o.strategy;
  pc.shard_size = o.shard_size;
  pc.tp = o.tp;
  pc.tp_plan = gpt_tensor_parallel_plan(cfg, o.sequence_parallel);
  pc.buckets = dpo;
  pc.buckets.deterministic = o.deterministic;
  if (o.checkpoint_activations) pc.checkpoint = {"h*"};  // every block
  if (!o.reduce_dtype.empty()) {
    pc.buckets.reduce_dtype = optim::compute_dtype(optim::parse_precision(o.reduce_dtype));
  }
  const optim::Precision precision = optim::parse_precision(o.precision);
  // the step's loss travels with the last gradient bucket (fp32 buckets only: not through a 16-bit one)
  const bool loss_rides = zero_stage == 0 && !o.deterministic &&
                          (pc.buckets.reduce_dtype ? *pc.buckets.reduce_dtype == at::kFloat
                                                   : precision == optim::Precision::kFp32);
  if (loss_rides) pc.buckets.side_values = 1;
  optim::LossScalerOptions scaler;
  if (o.loss_scale > 0) {
    scaler.dynamic = false;
    scaler.initial_scale = o.loss_scale;
  }
  optim::MixedPrecision mp(precision, scaler);
  auto par = parallel::parallelize(*gpt, world, pc, mp.wrap([&](std::vector<at::Tensor> tensors) {
    return std::make_unique<torch::optim::AdamW>(tensors, adamw);
  }));
  parallel::DataParallel* dp = loss_rides ? par->data_parallel() : nullptr;
  const bool lead = world->group_rank() == 0;
  if (lead && o.tp > 1) {
    std::printf(
        "dtrain train: tensor parallel over %ld ranks%s (mesh dp=%ld x tp=%ld); this rank's parts:\n%s",
        static_cast<long>(o.tp), o.sequence_parallel ? ", sequence parallel" : "", static_cast<long>(n),
        static_cast<long>(o.tp), par->tensor_parallel()->describe().c_str());
  }
  if (lead) {
    std::printf(
        "dtrain train: %ld data-parallel ranks, strategy %s: %zu gradient buckets of up to %.1f MiB, "
        "accumulation %ld\n",
        static_cast<long>(n),
        zero_stage == 0 ? "dp (Horovod-style data parallel)"
        : o.shard_size > 0
            ? str_cat("hsdp (ZeRO-3 within groups of ", o.shard_size, " ranks, replicated across them)")
                  .c_str()
            : str_cat("zero", zero_stage, " (DeepSpeed ZeRO stage ", zero_stage, ")").c_str(),
        par->bucket_count(), static_cast<double>(dpo.bucket_bytes) / (1 << 20),
        static_cast<long>(o.accumulation));
    if (o.checkpoint_activations) {
      std::printf("dtrain train: activation checkpointing: each of the %ld blocks recomputed in backward\n",
                  static_cast<long>(cfg.n_layer));
    }
    if (o.deterministic) {
      std::printf(
          "dtrain train: deterministic: %ld micro-batches of %ld sequences per step, %ld per rank, their "
          "gradients summed as one balanced tree; %d intra-op threads per rank (bitwise the same at any "
          "power-of-2 number of ranks with the same thread count)\n",
          static_cast<long>(o.accumulation), static_cast<long>(o.batch / o.accumulation),
          static_cast<long>(o.accumulation / n), at::get_num_threads());
    }
  }
  // Checkpoints: the data position is the step (each step's windows are drawn from the seed and the step).
  checkpoint::TrainingState ckpt(*gpt, *par, &mp);
  const nlohmann::json position{{"seed", o.seed}, {"batch", o.batch}, {"seq", cfg.block_size}};
  int64_t first_step = 1;
  if (!o.init_from.empty()) {
    ckpt.import_weights(o.init_from);
    if (lead) std::printf("dtrain train: weights imported from %s\n", o.init_from.c_str());
  }
  if (!o.resume.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const checkpoint::Resumed r = ckpt.load(o.resume);
    first_step = r.step + 1;
    if (lead) {
      std::printf("dtrain train: resumed from %s (step %ld) in %.2f s; random state %s\n", r.dir.c_str(),
                  static_cast<long>(r.step),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  r.rng_restored ? "restored" : "not restored (saved at another world size)");
      if (r.meta.value("seed", o.seed) != o.seed || r.meta.value("batch", o.batch) != o.batch) {
        std::printf(
            "dtrain train: note: the checkpoint's run drew its batches with seed %ld and batch %ld; this "
            "run uses seed %ld and batch %ld, so its batches from here on differ\n",
            static_cast<long>(r.meta.value("seed", o.seed)),
            static_cast<long>(r.meta.value("batch", o.batch)), static_cast<long>(o.seed),
            static_cast<long>(o.batch));
      }
    }
  }
  auto save = [&](int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string dir = ckpt.save(o.save, step, position, o.keep);
    if (lead) {
      std::printf("dtrain train: checkpoint of step %ld saved to %s in %.2f s\n", static_cast<long>(step),
                  dir.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
  };
  StepLog log(o, lead, o.batch * cfg.block_size, first_step);
  std::ofstream sample_file;  // opened now: a path that cannot be written fails before the training
  if (lead && !o.sample_file.empty()) {
    sample_file.open(o.sample_file, std::ios::trunc);
    if (!sample_file) {
      throw ValueError(str_cat("train: --sample-file ", o.sample_file,
                               " cannot be written. Name a file in a folder that exists and is writable."));
    }
  }
  const int64_t T = cfg.block_size;
  std::string last_step_comm;
  for (int64_t step = first_step; step <= o.steps; ++step) {
    at::Tensor w = sample_windows(corpus.train, o.batch, T, o.seed, step);
    tensor::CommLog::instance().clear();  // the log then holds one step
    par->zero_grad();
    double share = 0;  // this rank's part of the global mean loss
    at::Tensor global_loss;
    // deterministic: micro-batches of a fixed size, rank r taking micro-batches r*c .. r*c + c - 1, each loss
    // scaled by 1/K (the engine sums); otherwise each rank its rows of every micro-batch, averaged over ranks
    const int64_t c = o.deterministic ? o.accumulation / n : o.accumulation;
    for (int64_t k = 0; k < c; ++k) {
      parallel::RowRange micro =
          parallel::split_rows(o.batch, o.accumulation, o.deterministic ? me * c + k : k);
      parallel::RowRange mine =
          o.deterministic ? parallel::RowRange{0, micro.count} : parallel::split_rows(micro.count, n, me);
      at::Tensor rows = w.narrow(0, micro.start + mine.start, mine.count);
      const bool last = k == c - 1;
      par->set_requires_gradient_sync(last);
      at::Tensor loss = gpt->loss(rows.narrow(1, 0, T).contiguous(), rows.narrow(1, 1, T).contiguous());
      // The global loss is the mean over all rows; the strategies average over the n ranks.
      const double weight = static_cast<double>(mine.count) / static_cast<double>(o.batch);
      share += loss.item<double>() * weight;
      global_loss = at::full({1}, share, at::kDouble);
      if (last && dp) dp->reduce_with_gradients(global_loss);  // rides with the gradients
      // (16-bit: the loss scaled in fp32, so that the scale itself cannot overflow the format)
      (loss.to(at::kFloat) * (weight * static_cast<double>(o.deterministic ? 1 : n) * mp.loss_scale()))
          .backward();
    }
    const double lr = scheduled_lr(o, step);
    for (auto& g : par->optimizer().param_groups()) g.options().set_lr(lr);
    const bool take = mp.unscale(*par);  // 16-bit: into the fp32 masters; false for an inf or nan
    const double grad_norm = take && o.clip > 0 ? optim::clip_grad_norm(*par, o.clip) : -1.0;
    if (take) {
      par->step([&] { mp.copy_back(); });
    } else {
      par->zero_grad();
    }
    if (step == o.steps) last_step_comm = tensor::CommLog::instance().summary();
    if (log.wants(step)) {
      if (!dp) {  // dp's came with the gradients; the ranks of a tp group hold the same share
        world->all_reduce(global_loss)->wait();
        global_loss /= static_cast<double>(o.tp);
      }
      log.step(step, global_loss.item<double>(), grad_norm, lr);
    }
    if (!o.save.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == o.steps)) save(step);
  }
  // a resumed run with no step left saves what it loaded under its own layout: a conversion between layouts
  if (!o.save.empty() && first_step > o.steps) save(first_step - 1);
  // Model state as training leaves it (before the evaluation below gathers ZeRO-3's units for its forward),
  // and the peak memory of training (the evaluation's whole-batch forward is not training's).
  const parallel::ModelStateMemory state = par->memory();
  const double train_peak_mib = peak_rss_mib();
  double val = 0;
  {
    at::NoGradGuard no_grad;
    for (int64_t b = 0; b < o.eval_batches; ++b) {
      at::Tensor w = sample_windows(corpus.val, o.batch, T, o.seed, -1 - b);
      val += gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()).item<double>();
    }
  }
  const std::string sample = o.sample_bytes > 0 && o.tp == 1 ? generate(gpt, o, T) : "";
  if (lead) {
    print_end(o, log, val / static_cast<double>(o.eval_batches), last_step_comm, first_step);
    if (o.sample_bytes > 0 && o.tp > 1) {
      std::printf("dtrain train: no sample drawn: under --tp the logits are split over the vocabulary\n");
    } else if (o.sample_bytes > 0) {
      std::printf(
          "dtrain train: sample (%ld bytes after the prompt, top-%ld at temperature 0.8, seed %lu):\n%s\n",
          static_cast<long>(o.sample_bytes), static_cast<long>(o.top_k), static_cast<unsigned long>(o.seed),
          sample.c_str());
      if (sample_file.is_open()) sample_file << sample << "\n" << std::flush;
    }
    if (precision != optim::Precision::kFp32) {
      std::printf("mixed precision %s with fp32 master weights: %ld steps skipped for an inf or nan%s\n",
                  optim::to_string(precision), static_cast<long>(mp.skipped()),
                  precision == optim::Precision::kFp16 ? str_cat("; ", mp.scaler().to_string()).c_str() : "");
      std::printf(
          "mixed_precision_bookkeeping_ms_per_step %.3f (casts into and out of the fp32 masters, the "
          "unscaling and inf/nan check, the scaler; not the check's all-reduce; rank 0)\n",
          mp.bookkeeping_seconds() * 1000.0 / static_cast<double>(o.steps));
    }
    int64_t psi = 0;
    for (const auto& p : gpt->parameters()) psi += p.numel();
    const double mib = static_cast<double>(psi) / (1 << 20);
    std::printf(
        "peak resident memory of rank 0: %.1f MiB (%.1f MiB above its peak before the corpus and model, "
        "once the ranks connected; training, before the evaluation)\n",
        train_peak_mib, train_peak_mib - g_rss_before_model_mib);
    const double ns = static_cast<double>(o.shard_size > 0 ? o.shard_size : n);  // ranks sharing a copy
    if (precision != optim::Precision::kFp32) {  // the 16-bit formulas of DESIGN §5 are not printed here
      std::printf(
          "model state per rank: %s, plus fp32 masters %.2f MiB (%s parameters, fp32 masters and AdamW "
          "state)\n",
          state.to_string().c_str(), static_cast<double>(mp.master_bytes()) / (1 << 20),
          optim::to_string(precision));
    } else {
      std::printf("model state per rank: %s (fp32 AdamW over %ld parameters%s: %s = %.2f MiB)\n",
                  state.to_string().c_str(), static_cast<long>(psi),
                  o.tp > 1 ? " (this rank's tensor-parallel part)" : "",
                  zero_stage == 0   ? "16 bytes each"
                  : zero_stage == 1 ? "8 + 8/N bytes each"
                  : zero_stage == 2 ? "4 + 12/N bytes each"
                                    : "16/N bytes each",
                  zero_stage == 0   ? 16 * mib
                  : zero_stage == 1 ? (8 + 8.0 / ns) * mib
                  : zero_stage == 2 ? (4 + 12.0 / ns) * mib
                                    : 16.0 / ns * mib);
    }
  }
  world->barrier()->wait();
}

}  // namespace

void check_schedule(const TrainOptions& o) {
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine") {
    throw ValueError(str_cat("train: --lr-schedule '", o.lr_schedule,
                             "' is not a schedule dtrain has. Use constant or cosine."));
  }
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) {
    throw ValueError(str_cat("train: --lr ", o.lr,
                             " must be a learning rate of 0 or more (0: the weights stay), e.g. 1e-3."));
  }
  if (o.warmup < 0 || o.warmup > o.steps) {
    throw ValueError(
        str_cat("train: --warmup ", o.warmup, " must be between 0 and --steps (", o.steps, ")."));
  }
  if (!std::isfinite(o.min_lr) || o.min_lr > o.lr) {
    throw ValueError(str_cat("train: --min-lr ", o.min_lr, " must be at most --lr (", o.lr,
                             "); a negative value means lr / 10."));
  }
}

double scheduled_lr(const TrainOptions& o, int64_t step) {
  if (step <= o.warmup) return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup);
  if (o.lr_schedule == "constant") return o.lr;
  const double floor = o.min_lr < 0 ? o.lr / 10 : o.min_lr;
  const int64_t span = o.steps - o.warmup;  // steps warmup+1 .. steps: from lr down to floor
  const double t = span <= 1 ? 1.0 : static_cast<double>(step - o.warmup - 1) / static_cast<double>(span - 1);
  return floor + (o.lr - floor) * 0.5 * (1 + std::cos(M_PI * std::min(1.0, t)));
}

int train_gpt(const TrainOptions& o) {
  o.model.validate();
  check_schedule(o);
  if (o.eval_batches < 1 || o.eval_batches > 100000) {
    throw ValueError(str_cat("train: --eval-batches ", o.eval_batches, " must be between 1 and 100000."));
  }
  if (o.sample_bytes < 0 || o.sample_bytes > 100000 || o.top_k < 1 || o.top_k > 256) {
    throw ValueError(str_cat("train: --sample ", o.sample_bytes, " must be 0 to 100000 bytes and --top-k ",
                             o.top_k, " 1 to 256 (the byte vocabulary)."));
  }
  if (o.log_every < 1) {
    throw ValueError(
        str_cat("train: --log-every ", o.log_every, " must be at least 1. Use e.g. --log-every 20."));
  }
  // Batches beyond this machine's reach fail here, naming the flag, rather than deep inside libtorch.
  if (o.batch > (int64_t{1} << 20) || o.batch * (o.model.block_size + 1) > (int64_t{1} << 30)) {
    throw ValueError(str_cat("train: --batch ", o.batch, " sequences of ", o.model.block_size + 1,
                             " tokens is more than 2^30 tokens per step. Use a smaller --batch or --seq."));
  }
  if (o.save_every < 0 || o.keep < 0) {
    throw ValueError(str_cat("train: --save-every ", o.save_every, " and --keep ", o.keep,
                             " must not be negative (0: save at the end only; keep all)."));
  }
  if ((o.save_every > 0) && o.save.empty()) {
    throw ValueError("train: --save-every needs --save DIR (the folder the checkpoints go to).");
  }
  if (!o.resume.empty() && !o.init_from.empty()) {
    throw ValueError(str_cat("train: --resume ", o.resume, " and --init-from ", o.init_from,
                             " both set the weights. Use --resume to continue a run, --init-from to start a "
                             "new one from a safetensors file."));
  }
  if (o.batch < 1 || o.steps < 1) {
    throw ValueError(str_cat("train: --batch ", o.batch, " and --steps ", o.steps, " must be positive."));
  }
  if (o.accumulation < 1 || o.accumulation > o.batch) {
    throw ValueError(str_cat("train: --accumulation ", o.accumulation, " must be between 1 and --batch (",
                             o.batch, "): the global batch is split into that many micro-batches."));
  }
  // The names table's check, before any rank waits for the others (the degrees are checked against the world
  // size below, alike on every rank).
  const parallel::Strategy strategy = parallel::parse_strategy(o.strategy);
  const int zero_stage = strategy == parallel::Strategy::kZero1          ? 1
                         : strategy == parallel::Strategy::kZero2        ? 2
                         : strategy == parallel::Strategy::kDataParallel ? 0
                                                                         : 3;
  if (o.shard_size != 0 && strategy != parallel::Strategy::kHybridShard) {
    throw ValueError(str_cat("train: --shard-size ", o.shard_size, " is for --strategy hsdp only, not ",
                             o.strategy, ". Leave it out, or use --strategy hsdp."));
  }
  if (!(o.clip >= 0) || !std::isfinite(o.clip)) {
    throw ValueError(str_cat("train: --clip ", o.clip,
                             " must be a positive gradient norm (or 0: no clipping). Use e.g. --clip 1.0."));
  }
  {
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
  }
  if (o.sequence_parallel && o.tp == 1) {
    throw ValueError(
        "train: --sequence-parallel needs --tp of 2 or more (it splits the sequence over the "
        "tensor-parallel ranks). Add --tp, or leave it out.");
  }
  auto world = dtrain::init();
  g_rss_before_model_mib = peak_rss_mib();
  const int64_t ws = world->group_size();
  if (o.tp < 1 || ws % o.tp != 0) {
    throw ValueError(str_cat("train: --tp ", o.tp, " does not divide the world size ", ws,
                             ". Choose a divisor of ", ws, "."));
  }
  {
    parallel::ParallelConfig pc;
    pc.strategy = o.strategy;
    pc.shard_size = o.shard_size;
    pc.tp = o.tp;
    pc.tp_plan = gpt_tensor_parallel_plan(o.model, o.sequence_parallel);
    pc.buckets.deterministic = o.deterministic;
    parallel::validate_parallel_config(pc, ws);
  }
  const int64_t dp = ws / o.tp;
  if (o.batch / o.accumulation < dp) {
    throw ValueError(str_cat("train: --batch ", o.batch, " in ", o.accumulation, " micro-batches gives ",
                             o.batch / o.accumulation, " sequences per micro-batch, fewer than the ", dp,
                             " data-parallel ranks; each needs at least one. Use --batch of at least ",
                             dp * o.accumulation, "."));
  }
  if (o.deterministic) {
    const int64_t c = o.accumulation / dp;
    if (o.batch % o.accumulation != 0 || o.accumulation % dp != 0 || (c & (c - 1)) != 0) {
      throw ValueError(str_cat(
          "train: --deterministic cuts --batch ", o.batch, " into --accumulation ", o.accumulation,
          " micro-batches of one size, spread evenly over the ", dp,
          " data-parallel ranks, a power of 2 on each: --accumulation must divide --batch and be the ranks "
          "times 1, 2, 4, ... (e.g. --accumulation ",
          dp * 4, " with --batch a multiple of it)."));
    }
  }
  const bool lead = world->group_rank() == 0;
  TextCorpus corpus = load_text(o.data);
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;  // bytes
  cfg.seed = o.seed;
  models::GPT gpt(cfg);
  gpt->to(optim::compute_dtype(optim::parse_precision(o.precision)));  // fp32: as built
  int64_t n_params = 0;
  double sum_squares = 0;  // of the initial weights: a fingerprint a peer (bench/gpt_ddp.py) can compare
  for (const auto& p : gpt->parameters()) {
    n_params += p.numel();
    sum_squares += p.detach().to(at::kDouble).pow(2).sum().item<double>();
  }
  if (lead) {
    std::printf(
        "dtrain train: GPT %ld layers x %ld wide, %ld heads, %ld parameters (initial sum of squares "
        "%.9g); %s\n",
        static_cast<long>(cfg.n_layer), static_cast<long>(cfg.n_embd), static_cast<long>(cfg.n_head),
        static_cast<long>(n_params), sum_squares, corpus.source.c_str());
    std::printf("dtrain train: global batch %ld x %ld tokens, %ld steps\n", static_cast<long>(o.batch),
                static_cast<long>(cfg.block_size), static_cast<long>(o.steps));
  }
  train_parallel(o, world, gpt, corpus, cfg, zero_stage);
  return 0;
}

}  // namespace dtrain::train
