// The training run; see train_gpt.h.
#include "apps/dtrain/gpt/train_gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/dtrain/gpt/auto_layout.h"
#include "apps/dtrain/gpt/config.h"
#include "apps/dtrain/gpt/text_data.h"
#include "checkpoint/file_io.h"
#include "checkpoint/training_state.h"
#include "comm/comm_log.h"
#include "comm/init.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "dispatch/tensor_memory.h"
#include "mesh/device_mesh.h"
#include "optim/clip.h"
#include "optim/mixed_precision.h"
#include "parallel/data_parallel.h"
#include "parallel/parallelize.h"
#include "parallel/strategy.h"
#include "plan/memory_model.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"
#include "train/op_profile.h"
#include "train/solved_run.h"

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

// This process's peak resident set (VmHWM), in MiB; 0 where /proc does not say.
double g_rss_before_model_mib =
    0;  // peak resident memory once the ranks connected, before the corpus and model

double peak_rss_mib() { return process_memory_mib("VmHWM"); }

void print_end(const TrainOptions& o, const Trainer& t, double val, const std::string& last_step_comm,
               int64_t first_step) {
  if (first_step > o.steps) {
    std::printf(
        "dtrain train: no step left to run (resumed at step %ld, --steps %ld); validation loss %.4f\n",
        static_cast<long>(first_step - 1), static_cast<long>(o.steps), val);
  } else {
    std::printf(
        "dtrain train: loss %.4f -> %.4f over steps %ld..%ld; validation loss %.4f (uniform guess: %.4f)\n",
        t.first_loss(), t.last_loss(), static_cast<long>(first_step), static_cast<long>(o.steps), val,
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

// What the end of the run prints: training's memory (taken after the last step, before the evaluation's
// whole-batch forwards) and the validation loss.
class Report : public Callback {
 public:
  void on_step_end(Trainer& t, const StepInfo& s) override {
    if (s.step == t.options().steps) measure(t);
  }
  void on_evaluate(Trainer&, int64_t, double loss) override { val = loss; }
  void measure(Trainer& t) {
    if (t.solved_run() == nullptr) state = t.parallelized().memory();
    train_peak_mib = peak_rss_mib();
    measured = true;
  }
  parallel::ModelStateMemory state;
  double train_peak_mib = 0, val = 0;
  bool measured = false;
};

void print_layout(const TrainOptions& o, Trainer& t, parallel::Strategy strategy) {
  parallel::Parallelized& par = t.parallelized();
  const int64_t n = t.data_parallel_size();
  if (o.tp > 1) {
    std::printf("dtrain train: tensor parallel over %ld ranks%s (mesh %s); this rank's parts:\n%s",
                static_cast<long>(o.tp), o.sequence_parallel ? ", sequence parallel" : "",
                (parallel::groups_strided(o.mesh_order)
                     ? str_cat("tp=", o.tp, " x dp=", n, ", tp groups strided across hosts")
                     : str_cat("dp=", n, " x tp=", o.tp, ", tp groups on consecutive ranks"))
                    .c_str(),
                par.tensor_parallel()->describe().c_str());
  }
  const int64_t bucket_bytes =
      o.bucket_bytes > 0 ? o.bucket_bytes : parallel::with_horovod_env({}).bucket_bytes;
  std::printf(
      "dtrain train: %ld data-parallel ranks, strategy %s: %zu gradient buckets of up to %.1f MiB, "
      "accumulation %ld\n",
      static_cast<long>(n),
      strategy == parallel::Strategy::kDataParallel ? "dp (Horovod-style data parallel)"
      : o.shard_size > 0                            ? str_cat("hsdp (ZeRO-3 within groups of ", o.shard_size,
                                   parallel::groups_strided(o.mesh_order) ? " strided" : " consecutive",
                                                              " ranks, replicated across them)")
                               .c_str()
                         : str_cat(parallel::to_string(strategy), " (DeepSpeed ZeRO stage ",
                                   parallel::to_string(strategy) + 4, ")")
                               .c_str(),
      par.bucket_count(), static_cast<double>(bucket_bytes) / (1 << 20), static_cast<long>(o.accumulation));
  if (o.checkpoint_activations) {
    std::printf("dtrain train: activation checkpointing: each of the %ld blocks recomputed in backward\n",
                static_cast<long>(o.model.n_layer));
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

void print_memory(const TrainOptions& o, Trainer& t, const Report& report, parallel::Strategy strategy,
                  models::GPT& gpt) {
  const optim::MixedPrecision& mp = t.mixed_precision();
  const optim::Precision precision = mp.precision();
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
      report.train_peak_mib, report.train_peak_mib - g_rss_before_model_mib);
  const int64_t n = t.data_parallel_size();
  const double ns = static_cast<double>(o.shard_size > 0 ? o.shard_size : n);  // ranks sharing a copy
  if (precision != optim::Precision::kFp32) {  // the 16-bit formulas of DESIGN §5 are not printed here
    std::printf(
        "model state per rank: %s, plus fp32 masters %.2f MiB (%s parameters, fp32 masters and AdamW "
        "state)\n",
        report.state.to_string().c_str(), static_cast<double>(mp.master_bytes()) / (1 << 20),
        optim::to_string(precision));
  } else {
    std::printf("model state per rank: %s (fp32 AdamW over %ld parameters%s: %s = %.2f MiB)\n",
                report.state.to_string().c_str(), static_cast<long>(psi),
                o.tp > 1 ? " (this rank's tensor-parallel part)" : "",
                plan::model_state_formula(strategy).c_str(),
                plan::model_state_bytes_per_param(strategy, ns) * mib);
  }
}

}  // namespace

namespace {

int stage_of(parallel::Strategy s) {
  return s == parallel::Strategy::kDataParallel ? 0
         : s == parallel::Strategy::kZero1      ? 1
         : s == parallel::Strategy::kZero2      ? 2
                                                : 3;
}

// strategy "deepspeed" with its stage: the matching name. Pure, so that it can precede the option checks.
void resolve_deepspeed(TrainOptions& o) {
  std::string name = o.strategy;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "deepspeed") {
    if (o.zero_stage < 0) {
      throw ValueError(
          "train: --strategy deepspeed needs its ZeRO stage: --zero-stage 0-3 (strategy.zero_stage; a "
          "DeepSpeed "
          "config's zero_optimization.stage).");
    }
    o.strategy = o.zero_stage == 0 ? "dp" : str_cat("zero", o.zero_stage);
    o.config_notes.push_back(str_cat("strategy deepspeed, ZeRO stage ", o.zero_stage, ": ", o.strategy));
  } else if (o.zero_stage >= 0 && name != "auto" &&
             stage_of(parallel::parse_strategy(o.strategy)) != o.zero_stage) {
    throw ValueError(str_cat("train: --zero-stage ", o.zero_stage,
                             " (strategy.zero_stage) disagrees with --strategy ", o.strategy,
                             ". Use --strategy deepspeed with the stage, or leave --zero-stage out."));
  }
}

// Rank 0: the effective config (every key, after the config file, the flags, --set and what the world size
// resolved) printed, and saved as config.toml beside the checkpoints (written whole, then renamed).
void show_config(const TrainOptions& o) {
  const std::string text = effective_config(o);
  std::printf("dtrain train: effective config%s:\n",
              o.save.empty() ? "" : str_cat(" (saved to ", o.save, "/config.toml)").c_str());
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    std::printf("  | %s\n", text.substr(at, end - at).c_str());
    at = end + 1;
  }
  for (const auto& note : o.config_notes) std::printf("dtrain train: note: %s\n", note.c_str());
  std::fflush(stdout);
  if (o.save.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(o.save, ec);  // (a folder that cannot be made: the write names it)
  const std::string path = o.save + "/config.toml";
  checkpoint::write_file_atomic(
      path, str_cat("# dtrain train's effective config (dtrain train ", path, " runs it again)\n", text));
}

// FNV-1a over every parameter's bytes in registration order: runs with the same digest have the same bits
// (what --deterministic promises across world sizes). Where each rank holds every parameter whole (no ZeRO-3,
// no tensor parallel); "" elsewhere.
std::string parameter_digest(torch::nn::Module& m, parallel::Strategy strategy, int64_t tp) {
  if (strategy == parallel::Strategy::kZero3 || strategy == parallel::Strategy::kHybridShard || tp > 1)
    return "";
  uint64_t h = 1469598103934665603ull;
  for (const at::Tensor& p : m.parameters()) {
    const at::Tensor c = p.detach().contiguous();
    const auto* b = static_cast<const uint8_t*>(c.data_ptr());
    for (int64_t i = 0, n = c.numel() * c.element_size(); i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace

namespace {

// --solve-pin's "NAME=PLACEMENTS;..." as pairs.
std::vector<std::pair<std::string, std::string>> parse_solve_pins(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> pins;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ';')) {
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == part.size()) {
      throw ValueError(str_cat("train: --solve-pin '", part,
                               "' is not NAME=PLACEMENTS; give e.g. \"wte.weight=S(0);batch0=R\"."));
    }
    pins.emplace_back(part.substr(0, eq), part.substr(eq + 1));
  }
  return pins;
}

}  // namespace

void resolve_options(TrainOptions& o, int64_t world_size) {
  resolve_deepspeed(o);
  if (o.tp < 1 || world_size % o.tp != 0) return;  // (the Trainer names the bad --tp)
  const int64_t n = world_size / o.tp;
  if (o.micro_batch > 0) {
    if (o.accumulation_given || !o.batch_given) {
      const int64_t b = o.micro_batch * o.accumulation * n;
      if (o.batch_given && o.batch != b) {
        throw ValueError(str_cat("train: --batch ", o.batch, " (train_batch_size) is not --micro-batch ",
                                 o.micro_batch, " x --accumulation ", o.accumulation, " x ", n,
                                 " data-parallel ranks = ", b,
                                 ". Give two of the three, or make them agree."));
      }
      o.batch = b;
    } else {
      if (o.batch % (o.micro_batch * n) != 0) {
        throw ValueError(str_cat("train: --batch ", o.batch, " is not a multiple of --micro-batch ",
                                 o.micro_batch, " x ", n,
                                 " data-parallel ranks, so no accumulation gives it. Change one."));
      }
      o.accumulation = o.batch / (o.micro_batch * n);
    }
    o.config_notes.push_back(str_cat("batch ", o.batch, " = micro-batch ", o.micro_batch, " x accumulation ",
                                     o.accumulation, " x ", n, " data-parallel ranks"));
  }
  if (o.deterministic && !o.accumulation_given && o.micro_batch == 0) {
    o.accumulation = deterministic_accumulation(o.batch, n);
    o.config_notes.push_back(str_cat("deterministic: accumulation ", o.accumulation, " (", o.accumulation,
                                     " micro-batches of ", o.batch / o.accumulation,
                                     " sequences: the same bits at 1, 2, 4 and 8 data-parallel ranks)"));
  }
}

void check_train_options(const TrainOptions& o) {
  o.model.validate();
  check_trainer_options(o);
  if (o.eval_batches < 1 || o.eval_batches > 100000 || o.eval_every < 0) {
    throw ValueError(str_cat("train: --eval-batches ", o.eval_batches,
                             " must be between 1 and 100000 and --eval-every ", o.eval_every,
                             " 0 (at the end only) or more."));
  }
  if (o.sample_bytes < 0 || o.sample_bytes > 100000 || o.top_k < 1 || o.top_k > 256) {
    throw ValueError(str_cat("train: --sample ", o.sample_bytes, " must be 0 to 100000 bytes and --top-k ",
                             o.top_k, " 1 to 256 (the byte vocabulary)."));
  }
  // Batches beyond this machine's reach fail here, naming the flag, rather than deep inside libtorch.
  if (o.batch > (int64_t{1} << 20) || o.batch * (o.model.block_size + 1) > (int64_t{1} << 30)) {
    throw ValueError(str_cat("train: --batch ", o.batch, " sequences of ", o.model.block_size + 1,
                             " tokens is more than 2^30 tokens per step. Use a smaller --batch or --seq."));
  }
}

int train_gpt(const TrainOptions& options) {
  TrainOptions o = options;
  o.tokens_per_sample = o.model.block_size;
  resolve_deepspeed(o);
  o.solve_pins = parse_solve_pins(o.solve_pin_text);
  {  // every option alone, before any rank waits for the others ("auto" is checked as dp)
    TrainOptions c = o;
    if (c.strategy == "auto") c.strategy = "dp";
    check_train_options(c);
  }
  auto world = dtrain::init();
  // tensor_peak_mib (the metrics) counts the model's own tensors too; the planner counts activations
  if (!o.metrics.empty() || o.strategy == "auto") dispatch::install_tensor_memory_counter();
  g_rss_before_model_mib = peak_rss_mib();
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;  // bytes
  cfg.seed = o.seed;
  models::GPT gpt(cfg);
  int64_t n_params = 0;
  for (const auto& p : gpt->parameters()) n_params += p.numel();
  const TextCorpus corpus = load_text(o.data);
  if (o.strategy == "auto") {
    if (o.micro_batch > 0) {
      throw ValueError(
          str_cat("train: --strategy auto chooses the micro-batch and accumulation itself; give ",
                  "the global batch (--batch) and leave out --micro-batch ", o.micro_batch, "."));
    }
    choose_layout(o, world, corpus);
  }
  const bool solve = o.strategy == kSolveStrategy;
  if (solve && o.micro_batch > 0) {
    throw ValueError(
        str_cat("train: --micro-batch ", o.micro_batch,
                " is per data-parallel rank; --strategy solve has none (the plan places the batch). "
                "Give --batch and --accumulation."));
  }
  resolve_options(o, world->group_size());
  o.tp_plan = gpt_tensor_parallel_plan(o.model, o.sequence_parallel);
  if (o.checkpoint_activations) o.activation_checkpointing = {"h*"};  // every block
  check_train_options(o);
  if (world->group_rank() == 0) show_config(o);
  const parallel::Strategy strategy =
      solve ? parallel::Strategy::kDataParallel : parallel::parse_strategy(o.strategy);  // (solve: unused)
  const bool lead = world->group_rank() == 0;
  const int64_t T = cfg.block_size;
  // every window of the training text once per epoch, in an order drawn from the seed and the epoch
  const DistributedSampler sampler(window_count(corpus.train, T), o.batch, o.seed);
  const int64_t val_windows = window_count(corpus.val, T);
  gpt->to(optim::compute_dtype(optim::parse_precision(o.precision)));  // fp32: as built
  double sum_squares = 0;  // of the initial weights: a fingerprint a peer (bench/gpt_ddp.py) can compare
  for (const auto& p : gpt->parameters())
    sum_squares += p.detach().to(at::kDouble).pow(2).sum().item<double>();
  if (lead) {
    std::printf(
        "dtrain train: GPT %ld layers x %ld wide, %ld heads, %ld parameters (initial sum of squares "
        "%.9g); %s\n",
        static_cast<long>(cfg.n_layer), static_cast<long>(cfg.n_embd), static_cast<long>(cfg.n_head),
        static_cast<long>(n_params), sum_squares, corpus.source.c_str());
    std::printf(
        "dtrain train: global batch %ld x %ld tokens, %ld steps; %ld training windows (an epoch is %.1f "
        "steps)\n",
        static_cast<long>(o.batch), static_cast<long>(T), static_cast<long>(o.steps),
        static_cast<long>(sampler.samples()),
        static_cast<double>(sampler.samples()) / static_cast<double>(o.batch));
  }
  auto loss = [&](const Trainer::Batch& rows) {
    const at::Tensor& w = rows[0];
    return gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
  };
  auto batches = [&](int64_t step) -> Trainer::Batch {
    return {windows(corpus.train, T, sampler.step_indices(step))};
  };
  Trainer trainer(*gpt, loss, batches, o, world);
  // the data position is the step: the sampler's sequence is a function of the step, the seed and the batch
  trainer.checkpoint_meta = {{"seq", T}, {"windows", sampler.samples()}};
  trainer.set_evaluation(
      [&](int64_t b) -> Trainer::Batch {
        // windows spread evenly over the whole validation text, every evaluation the same ones
        const int64_t total = o.eval_batches * o.batch;
        const at::Tensor k = at::arange(b * o.batch, (b + 1) * o.batch, at::kLong);
        return {windows(corpus.val, T, at::div(k * val_windows, total, "floor").remainder(val_windows))};
      },
      o.eval_batches, o.eval_every);
  if (lead && !o.sample_file.empty()) {  // a path that cannot be written fails before the training
    std::ofstream f(o.sample_file, std::ios::trunc);
    if (!f) {
      throw ValueError(str_cat("train: --sample-file ", o.sample_file,
                               " cannot be written. Name a file in a folder that exists and is writable."));
    }
  }
  auto report = std::make_shared<Report>();
  trainer.add_callback(report);
  // An op-by-op profile of the steps after the second (train/op_profile.h), for bench/compare_ops.py.
  if (const char* profile = std::getenv("DTRAIN_OP_PROFILE"); profile != nullptr && *profile != '\0') {
    trainer.add_callback(std::make_shared<OpProfile>(profile));
  }
  if (lead && !solve) print_layout(o, trainer, strategy);
  const int64_t first_step = trainer.first_step();
  trainer.fit();
  if (!report->measured) report->measure(trainer);
  const std::string digest = lead && !solve ? parameter_digest(*gpt, strategy, o.tp) : "";
  const std::string sample = o.sample_bytes > 0 && o.tp == 1 ? generate(gpt, o, T) : "";
  if (lead) {
    print_end(o, trainer, report->val, trainer.last_step_comm(), first_step);
    if (o.sample_bytes > 0 && o.tp > 1) {
      std::printf("dtrain train: no sample drawn: under --tp the logits are split over the vocabulary\n");
    } else if (o.sample_bytes > 0) {
      std::printf(
          "dtrain train: sample (%ld bytes after the prompt, top-%ld at temperature 0.8, seed %lu):\n%s\n",
          static_cast<long>(o.sample_bytes), static_cast<long>(o.top_k), static_cast<unsigned long>(o.seed),
          sample.c_str());
      if (!o.sample_file.empty()) {
        std::ofstream f(o.sample_file, std::ios::trunc);
        f << sample << "\n" << std::flush;
        if (!f) std::printf("dtrain train: the sample could not be written to %s\n", o.sample_file.c_str());
      }
    }
    if (solve) {
      const plan::SolvedStep& s = trainer.solved_run()->solved();
      std::printf(
          "peak resident memory of rank 0: %.1f MiB (%.1f MiB above its peak before the corpus and model); "
          "the "
          "plan's memory at the step's peak: %.1f MiB per rank (predicted)\n",
          report->train_peak_mib, report->train_peak_mib - g_rss_before_model_mib,
          s.solution.memory / (1 << 20));
    } else {
      print_memory(o, trainer, *report, strategy, gpt);
    }
    if (!digest.empty()) {
      std::printf(
          "dtrain train: parameter digest %s (FNV-1a of every parameter's bytes: the same digest, the same "
          "bits)\n",
          digest.c_str());
    }
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace dtrain::train
