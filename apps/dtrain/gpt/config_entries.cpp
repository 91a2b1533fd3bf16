// The configuration schema's table; see detail/config_entries.h and config.h.
#include "apps/dtrain/gpt/detail/config_entries.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <string>

namespace dtrain::train::detail {

// A TOML basic string: JSON's escapes are TOML's (\", \\, \n, \uXXXX).
std::string toml_string(const std::string& s) { return nlohmann::json(s).dump(); }

// The shortest text that reads back as `d`, as a TOML float (with a '.' or an exponent).
std::string toml_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {

template <class T>
Entry int_key(std::string key, std::string flag, double lo, double hi, std::string help,
              std::function<T&(TrainOptions&)> ref, Kind kind = Kind::kInt) {
  Entry e{{std::move(key), std::move(flag), kind, lo, hi, {}, std::move(help)}, {}};
  e.access.set = [ref](TrainOptions& o, const Value& v) { ref(o) = static_cast<T>(v.i); };
  e.access.get = [ref](const TrainOptions& o) { return std::to_string(ref(const_cast<TrainOptions&>(o))); };
  return e;
}

Entry float_key(std::string key, std::string flag, double lo, double hi, std::string help,
                std::function<double&(TrainOptions&)> ref) {
  Entry e{{std::move(key), std::move(flag), Kind::kFloat, lo, hi, {}, std::move(help)}, {}};
  e.access.set = [ref](TrainOptions& o, const Value& v) { ref(o) = v.d; };
  e.access.get = [ref](const TrainOptions& o) { return toml_double(ref(const_cast<TrainOptions&>(o))); };
  return e;
}

Entry string_key(std::string key, std::string flag, std::vector<std::string> choices, std::string help,
                 std::function<std::string&(TrainOptions&)> ref) {
  Entry e{{std::move(key), std::move(flag), Kind::kString, 0, 0, std::move(choices), std::move(help)}, {}};
  e.access.set = [ref](TrainOptions& o, const Value& v) { ref(o) = v.s; };
  e.access.get = [ref](const TrainOptions& o) { return toml_string(ref(const_cast<TrainOptions&>(o))); };
  return e;
}

Entry bool_key(std::string key, std::string flag, std::string help, std::function<bool&(TrainOptions&)> ref) {
  Entry e{{std::move(key), std::move(flag), Kind::kBool, 0, 0, {}, std::move(help)}, {}};
  e.access.set = [ref](TrainOptions& o, const Value& v) { ref(o) = v.b; };
  e.access.get = [ref](const TrainOptions& o) {
    return ref(const_cast<TrainOptions&>(o)) ? "true" : "false";
  };
  return e;
}

constexpr double kBig = 1e15;  // "no practical limit" for counts

}  // namespace

const std::vector<Entry>& entries() {
  static const std::vector<Entry> all = [] {
    std::vector<Entry> v;
    // [model]
    v.push_back(int_key<int64_t>("model.layers", "--layers", 1, 1024, "Transformer blocks",
                                 [](TrainOptions& o) -> int64_t& { return o.model.n_layer; }));
    v.push_back(int_key<int64_t>("model.width", "--width", 1, 65536, "Model width (a multiple of --heads)",
                                 [](TrainOptions& o) -> int64_t& { return o.model.n_embd; }));
    v.push_back(int_key<int64_t>("model.heads", "--heads", 1, 1024, "Attention heads",
                                 [](TrainOptions& o) -> int64_t& { return o.model.n_head; }));
    v.push_back(int_key<int64_t>("model.seq", "--seq", 1, 1 << 20, "Sequence length (tokens of context)",
                                 [](TrainOptions& o) -> int64_t& { return o.model.block_size; }));
    // [data]
    v.push_back(string_key("data.path", "--data", {},
                           "A text file or a folder of text files (one token per byte)",
                           [](TrainOptions& o) -> std::string& { return o.data; }));
    // [train]
    v.push_back(int_key<int64_t>("train.steps", "--steps", 1, kBig, "Optimizer steps",
                                 [](TrainOptions& o) -> int64_t& { return o.steps; }));
    v.push_back(int_key<int64_t>("train.batch", "--batch", 1, 1 << 20,
                                 "Global batch (sequences per step), split over the data-parallel ranks",
                                 [](TrainOptions& o) -> int64_t& { return o.batch; }));
    v.push_back(int_key<int64_t>(
        "train.micro_batch", "--micro-batch", 0, 1 << 20,
        "Sequences per rank per micro-step (DeepSpeed's train_micro_batch_size_per_gpu; 0: from the batch): "
        "then the batch is micro_batch x accumulation x the data-parallel ranks",
        [](TrainOptions& o) -> int64_t& { return o.micro_batch; }));
    v.push_back(int_key<int64_t>(
        "train.accumulation", "--accumulation", 1, 1 << 20,
        "Micro-batches per step: the global batch is split this many ways, gradients communicated once",
        [](TrainOptions& o) -> int64_t& { return o.accumulation; }));
    v.push_back(float_key("train.clip", "--clip", 0, 1e12,
                          "Clip the gradients to this global L2 norm over every shard and mesh axis (0: no "
                          "clipping); the norm before clipping is logged",
                          [](TrainOptions& o) -> double& { return o.clip; }));
    v.push_back(
        int_key<uint64_t>("train.seed", "--seed", 0, 9.2e18,
                          "Seed of the weights, the data order and libtorch's generator (seed + rank)",
                          [](TrainOptions& o) -> uint64_t& { return o.seed; }));
    // [strategy]
    v.push_back(string_key(
        "strategy.name", "--strategy", {},
        "dp (Horovod-style data parallel; also ddp, horovod), zero1, zero2, zero3 (DeepSpeed ZeRO stages; "
        "also "
        "deepspeed1..3, fsdp), deepspeed (with strategy.zero_stage), hsdp (zero3 within groups of "
        "--shard-size "
        "ranks, replicated across them), auto (the planner's choice from measured costs: "
        "docs/planning.md), or solve (every op placed by the whole-step sharding solver, no hand-written "
        "layout: docs/planning.md, \"Training by a solved plan\")",
        [](TrainOptions& o) -> std::string& { return o.strategy; }));
    v.push_back(int_key<int64_t>("strategy.zero_stage", "--zero-stage", -1, 3,
                                 "With --strategy deepspeed: DeepSpeed's zero_optimization.stage (0: data "
                                 "parallel, 1-3: ZeRO); -1: not set",
                                 [](TrainOptions& o) -> int64_t& { return o.zero_stage; }));
    v.push_back(int_key<int64_t>("strategy.tp", "--tp", 1, 4096,
                                 "Tensor-parallel ranks (consecutive): Megatron's block layout (q, k, v and "
                                 "fc colwise, the projections "
                                 "rowwise, the embedding vocabulary parallel, loss-parallel cross entropy); "
                                 "the strategy runs over the "
                                 "other mesh axis",
                                 [](TrainOptions& o) -> int64_t& { return o.tp; }));
    v.push_back(
        bool_key("strategy.sequence_parallel", "--sequence-parallel",
                 "With --tp: LayerNorms and residuals on each rank's part of the sequence (all-gather / "
                 "reduce-scatter at the block edges instead of all-reduce)",
                 [](TrainOptions& o) -> bool& { return o.sequence_parallel; }));
    v.push_back(int_key<int64_t>("strategy.shard_size", "--shard-size", 0, 1 << 20,
                                 "hsdp: ranks per ZeRO-3 group (consecutive ranks)",
                                 [](TrainOptions& o) -> int64_t& { return o.shard_size; }));
    v.push_back(
        string_key("strategy.mesh_order", "--mesh-order", {},
                   "The mesh's axes, outermost first: \"tp,dp\" lays the tp groups across hosts, "
                   "\"shard,replicate\" hsdp's shard groups (\"\": tp, or shard, on consecutive ranks)",
                   [](TrainOptions& o) -> std::string& { return o.mesh_order; }));
    v.push_back(string_key("strategy.solve_mesh", "--solve-mesh", {},
                           "strategy solve: the mesh's axis sizes, e.g. 2,2 (\"\": one axis of every rank)",
                           [](TrainOptions& o) -> std::string& { return o.solve_mesh; }));
    v.push_back(int_key<int64_t>(
        "strategy.solve_budget", "--solve-budget", 0, 1e15,
        "strategy solve: the memory per rank the plan must fit at the step's peak, e.g. 64M (0: none)",
        [](TrainOptions& o) -> int64_t& { return o.solve_budget; }, Kind::kBytes));
    v.push_back(
        string_key("strategy.solve_pins", "--solve-pin", {},
                   "strategy solve: values the solver keeps where given, NAME=PLACEMENTS separated by ';' "
                   "(\"wte.weight=S(0);batch0=R\"; the inputs are batch0, and batch0:K for micro-batch K)",
                   [](TrainOptions& o) -> std::string& { return o.solve_pin_text; }));
    v.push_back(int_key<int64_t>(
        "strategy.solve_batch_axis", "--solve-batch-axis", -1, 16,
        "strategy solve: the mesh axis the batch stays sharded over, as data parallel's (-1: the solver's "
        "choice)",
        [](TrainOptions& o) -> int64_t& { return o.solve_batch_axis; }));
    v.push_back(int_key<int64_t>(
        "strategy.bucket_bytes", "--bucket-bytes", 0, 1e12,
        "Gradient bucket size in bytes, e.g. 25M (0: 25M, or HOROVOD_FUSION_THRESHOLD); under zero3/hsdp "
        "also "
        "the most bytes of parameters gathered together (a unit of whole submodules)",
        [](TrainOptions& o) -> int64_t& { return o.bucket_bytes; }, Kind::kBytes));
    v.push_back(bool_key("strategy.deterministic", "--deterministic",
                         "Bitwise the same parameters at any power-of-2 number of data-parallel ranks (dp, "
                         "zero1-3; one intra-op thread per rank, pinned): the global batch is cut into "
                         "--accumulation fixed micro-batches (unset: 8, for 1, 2, 4 and 8 ranks; the batch "
                         "must then be a multiple of 8), their gradients summed as one balanced tree",
                         [](TrainOptions& o) -> bool& { return o.deterministic; }));
    v.push_back(
        bool_key("strategy.checkpoint_activations", "--checkpoint-activations",
                 "Activation checkpointing per transformer block: each block keeps only its input and "
                 "recomputes the rest in backward",
                 [](TrainOptions& o) -> bool& { return o.checkpoint_activations; }));
    // [precision]
    v.push_back(string_key("precision.dtype", "--precision", {"fp32", "bf16", "fp16"},
                           "Compute precision, with fp32 master weights in the optimizer and, for fp16, "
                           "DeepSpeed's dynamic loss scaling; any strategy and tp",
                           [](TrainOptions& o) -> std::string& { return o.precision; }));
    v.push_back(string_key("precision.reduce_dtype", "--reduce-dtype", {"", "fp32", "bf16", "fp16"},
                           "The dtype gradients are reduced in (\"\": the precision's), e.g. fp32 under bf16",
                           [](TrainOptions& o) -> std::string& { return o.reduce_dtype; }));
    v.push_back(float_key("precision.loss_scale", "--loss-scale", 0, 1e30,
                          "fp16: 0 for dynamic loss scaling (the default), or a static scale, e.g. 1024 "
                          "(DeepSpeed's fp16.loss_scale); an overflowing step is skipped either way",
                          [](TrainOptions& o) -> double& { return o.loss_scale; }));
    v.push_back(float_key("precision.initial_scale_power", "--initial-scale-power", 0, 100,
                          "fp16 dynamic scaling: the first scale is 2^this (DeepSpeed's initial_scale_power)",
                          [](TrainOptions& o) -> double& { return o.initial_scale_power; }));
    v.push_back(int_key<int64_t>("precision.loss_scale_window", "--loss-scale-window", 1, kBig,
                                 "fp16 dynamic scaling: clean steps before the scale doubles",
                                 [](TrainOptions& o) -> int64_t& { return o.scaler.window; }));
    v.push_back(int_key<int64_t>("precision.hysteresis", "--hysteresis", 1, kBig,
                                 "fp16 dynamic scaling: overflows absorbed before the scale halves",
                                 [](TrainOptions& o) -> int64_t& { return o.scaler.hysteresis; }));
    v.push_back(float_key("precision.min_loss_scale", "--min-loss-scale", 1e-30, 1e30,
                          "fp16 dynamic scaling: the scale never goes below this",
                          [](TrainOptions& o) -> double& { return o.scaler.min_scale; }));
    v.push_back(bool_key("precision.consecutive_hysteresis", "",
                         "fp16 dynamic scaling: every clean step refills the hysteresis (DeepSpeed's "
                         "consecutive_hysteresis)",
                         [](TrainOptions& o) -> bool& { return o.scaler.consecutive_hysteresis; }));
    // [optimizer]
    v.push_back(string_key("optimizer.type", "", {"adamw"}, "The optimizer: AdamW (decoupled weight decay)",
                           [](TrainOptions& o) -> std::string& { return o.optimizer; }));
    v.push_back(float_key("optimizer.lr", "--lr", 0, 100, "AdamW's (peak) learning rate",
                          [](TrainOptions& o) -> double& { return o.lr; }));
    v.push_back(float_key("optimizer.weight_decay", "--weight-decay", 0, 100, "AdamW's weight decay",
                          [](TrainOptions& o) -> double& { return o.weight_decay; }));
    v.push_back(float_key("optimizer.beta1", "--beta1", 0, 0.999999, "AdamW's beta1",
                          [](TrainOptions& o) -> double& { return o.beta1; }));
    v.push_back(float_key("optimizer.beta2", "--beta2", 0, 0.999999999, "AdamW's beta2",
                          [](TrainOptions& o) -> double& { return o.beta2; }));
    v.push_back(float_key("optimizer.eps", "--eps", 1e-30, 1, "AdamW's epsilon",
                          [](TrainOptions& o) -> double& { return o.eps; }));
    // [schedule]
    v.push_back(
        string_key("schedule.name", "--lr-schedule", {"constant", "cosine", "linear"},
                   "After --warmup: constant (--lr), cosine (a half cosine from --lr down to --min-lr at "
                   "the last step) or linear (DeepSpeed's WarmupDecayLR: a line from --lr down to "
                   "--min-lr one step after the last)",
                   [](TrainOptions& o) -> std::string& { return o.lr_schedule; }));
    v.push_back(int_key<int64_t>("schedule.warmup", "--warmup", 0, kBig,
                                 "Steps of warmup from --warmup-min-lr (or lr/warmup) up to --lr",
                                 [](TrainOptions& o) -> int64_t& { return o.warmup; }));
    v.push_back(
        string_key("schedule.warmup_type", "--warmup-type", {"linear", "log"},
                   "The warmup's shape: linear, or log (DeepSpeed's default: lr grows with the log of the "
                   "step; needs --warmup-min-lr)",
                   [](TrainOptions& o) -> std::string& { return o.warmup_type; }));
    v.push_back(float_key("schedule.warmup_min_lr", "--warmup-min-lr", -1, 100,
                          "The warmup's first learning rate (negative: lr / warmup, the first step of a line "
                          "from 0)",
                          [](TrainOptions& o) -> double& { return o.warmup_min_lr; }));
    v.push_back(float_key("schedule.min_lr", "--min-lr", -1, 100,
                          "The decay's last learning rate (negative: --lr / 10)",
                          [](TrainOptions& o) -> double& { return o.min_lr; }));
    // [checkpoint]
    v.push_back(
        string_key("checkpoint.dir", "--save", {},
                   "Save checkpoints under this folder (step-<N>, and 'latest' naming the newest): every "
                   "--save-every steps and at the end; sharded, atomic, loadable at any world size and "
                   "strategy; the effective config is saved beside them (config.toml)",
                   [](TrainOptions& o) -> std::string& { return o.save; }));
    v.push_back(int_key<int64_t>("checkpoint.every", "--save-every", 0, kBig,
                                 "Steps between checkpoints (0: at the end only)",
                                 [](TrainOptions& o) -> int64_t& { return o.save_every; }));
    v.push_back(int_key<int64_t>("checkpoint.keep", "--keep", 0, kBig,
                                 "Checkpoints kept under --save, the newest (0: all)",
                                 [](TrainOptions& o) -> int64_t& { return o.keep; }));
    v.push_back(string_key(
        "checkpoint.resume", "--resume", {},
        "Continue the run saved here (a step folder, or a --save folder: its latest) under any world size, "
        "strategy and tp; auto: the latest under --save if there is one, else start afresh. A group "
        "restarted "
        "by `dtrain run --max-restarts` with --save resumes so by itself",
        [](TrainOptions& o) -> std::string& { return o.resume; }));
    v.push_back(
        string_key("checkpoint.init_from", "--init-from", {},
                   "Start from the weights of this safetensors file (e.g. `dtrain ckpt export`'s), any "
                   "layout",
                   [](TrainOptions& o) -> std::string& { return o.init_from; }));
    // [eval]
    v.push_back(int_key<int64_t>("eval.batches", "--eval-batches", 1, 100000,
                                 "Batches of the held-out text (the last 5%) each validation loss averages",
                                 [](TrainOptions& o) -> int64_t& { return o.eval_batches; }));
    v.push_back(
        int_key<int64_t>("eval.every", "--eval-every", 0, kBig,
                         "Also measure the validation loss every this many steps (0: at the end only)",
                         [](TrainOptions& o) -> int64_t& { return o.eval_every; }));
    // [log]
    v.push_back(int_key<int64_t>("log.every", "--log-every", 1, kBig, "Log the loss every this many steps",
                                 [](TrainOptions& o) -> int64_t& { return o.log_every; }));
    v.push_back(
        string_key("log.metrics", "--metrics", {},
                   "Write one JSON object per step (step, loss, lr, elapsed_s, tokens_per_s, rss_mib and "
                   "tensor_peak_mib of each rank, grad_norm with --clip, loss_scale under fp16) and one per "
                   "evaluation (step, val_loss) to this file; a resumed run appends",
                   [](TrainOptions& o) -> std::string& { return o.metrics; }));
    v.push_back(
        string_key("log.timeline", "--timeline", {},
                   "Write a Chrome-trace (Perfetto) timeline of every rank's forward, backward, optimizer "
                   "and each collective to this file at the end (open it in ui.perfetto.dev)",
                   [](TrainOptions& o) -> std::string& { return o.timeline; }));
    v.push_back(bool_key("log.verbose", "--verbose", "strategy auto: also print every candidate's prediction",
                         [](TrainOptions& o) -> bool& { return o.verbose; }));
    // [plan] (strategy auto and dtrain plan: docs/planning.md)
    v.push_back(int_key<int64_t>(
        "plan.memory_budget", "--memory-budget", 0, 1e15,
        "Bytes held by tensors per rank that a plan may use, e.g. 2G (0: the memory free per rank on the "
        "host, less the runtime)",
        [](TrainOptions& o) -> int64_t& { return o.memory_budget; }, Kind::kBytes));
    v.push_back(
        string_key("plan.profile", "--profile", {},
                   "The links' profile (dtrain bench comm --profile): \"\" measures it once and caches "
                   "it, builtin uses built-in figures",
                   [](TrainOptions& o) -> std::string& { return o.profile; }));
    v.push_back(
        int_key<int64_t>("plan.auto_confirm", "--auto-confirm", 0, 16,
                         "strategy auto: time the top K candidates for a few steps and keep the fastest",
                         [](TrainOptions& o) -> int64_t& { return o.auto_confirm; }));
    // [sample]
    v.push_back(int_key<int64_t>("sample.bytes", "--sample", 0, 100000,
                                 "Generate this many bytes of text after the training and print them",
                                 [](TrainOptions& o) -> int64_t& { return o.sample_bytes; }));
    v.push_back(string_key("sample.prompt", "--sample-prompt", {}, "The text the sample continues",
                           [](TrainOptions& o) -> std::string& { return o.sample_prompt; }));
    v.push_back(int_key<int64_t>("sample.top_k", "--top-k", 1, 256,
                                 "The sample draws each byte from the k likeliest (temperature 0.8)",
                                 [](TrainOptions& o) -> int64_t& { return o.top_k; }));
    v.push_back(string_key("sample.file", "--sample-file", {}, "Also write the sample to this file",
                           [](TrainOptions& o) -> std::string& { return o.sample_file; }));
    return v;
  }();
  return all;
}

}  // namespace dtrain::train::detail
