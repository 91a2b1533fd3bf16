// The configuration schema and its readers; see config.h.
#include "apps/dtrain/gpt/config.h"

#include <toml++/toml.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/units.h"

namespace dtrain::train {

namespace {

using Kind = ConfigKey::Kind;

// A value as read: from TOML (typed) or from text (a flag's or --set's).
struct Value {
  Kind kind;
  int64_t i = 0;
  double d = 0;
  std::string s;
  bool b = false;
  std::string shown;  // as the user wrote it, for messages
};

// Where each key's value lives in TrainOptions.
struct Access {
  std::function<void(TrainOptions&, const Value&)> set;
  std::function<std::string(const TrainOptions&)> get;  // TOML text
};

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

struct Entry {
  ConfigKey key;
  Access access;
};

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
        "ranks, replicated across them), or auto (the planner's choice from measured costs: "
        "docs/planning.md)",
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

const Entry* find_entry(const std::string& key) {
  for (const auto& e : entries()) {
    if (e.key.key == key) return &e;
  }
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string range_text(const ConfigKey& k) {
  auto num = [&](double x) {  // integers in full below 1e15 (1048576, not 1.04858e+06)
    if ((k.kind == Kind::kInt || k.kind == Kind::kBytes) && std::abs(x) < 1e15) {
      return std::to_string(static_cast<int64_t>(x));
    }
    std::ostringstream out;
    out << x;
    return out.str();
  };
  switch (k.kind) {
    case Kind::kInt:
      return str_cat("an integer from ", num(k.min), " to ", num(k.max));
    case Kind::kBytes:
      return str_cat("a byte count from ", num(k.min), " to ", num(k.max),
                     " (an integer, or text such as \"25M\")");
    case Kind::kFloat:
      return str_cat("a number from ", num(k.min), " to ", num(k.max));
    case Kind::kBool:
      return "true or false";
    case Kind::kString: {
      if (k.choices.empty()) return "a string";
      std::string s = "one of";
      for (size_t i = 0; i < k.choices.size(); ++i) s += str_cat(i ? ", " : " ", "\"", k.choices[i], "\"");
      return s;
    }
  }
  return "";
}

// Checks `v` against `k` (converting an integer to a float where a float is wanted) and sets it.
void check_and_set(TrainOptions& o, const Entry& e, Value v, const std::string& origin) {
  const ConfigKey& k = e.key;
  auto wrong = [&](const std::string& what) {
    return ValueError(
        str_cat(origin, ": ", k.key, " = ", v.shown, " ", what, "; it must be ", range_text(k), "."));
  };
  if (k.kind == Kind::kFloat && v.kind == Kind::kInt) {
    v.kind = Kind::kFloat;
    v.d = static_cast<double>(v.i);
  }
  if (k.kind == Kind::kBytes && v.kind == Kind::kString) {
    try {
      v.i = parse_bytes(k.key, v.s);
    } catch (const ValueError&) {
      throw wrong("is not a byte count");
    }
    v.kind = Kind::kBytes;
  }
  if (k.kind == Kind::kBytes && v.kind == Kind::kInt) v.kind = Kind::kBytes;
  if (v.kind != k.kind) {
    const char* what = v.kind == Kind::kInt      ? "is an integer"
                       : v.kind == Kind::kFloat  ? "is a number with a fraction"
                       : v.kind == Kind::kString ? "is a string"
                       : v.kind == Kind::kBool   ? "is a boolean"
                                                 : "is of another kind";
    throw wrong(what);
  }
  if ((k.kind == Kind::kInt || k.kind == Kind::kBytes) &&
      (static_cast<double>(v.i) < k.min || static_cast<double>(v.i) > k.max)) {
    throw wrong("is out of range");
  }
  if (k.kind == Kind::kFloat && (!std::isfinite(v.d) || v.d < k.min || v.d > k.max))
    throw wrong("is out of range");
  if (k.kind == Kind::kString && !k.choices.empty() &&
      std::find(k.choices.begin(), k.choices.end(), v.s) == k.choices.end()) {
    throw wrong("is not a value it takes");
  }
  e.access.set(o, v);
  if (k.key == "train.batch") o.batch_given = true;
  if (k.key == "train.accumulation") o.accumulation_given = true;
}

const Entry& entry_or_throw(const std::string& key, const std::string& origin) {
  const Entry* e = find_entry(key);
  if (e == nullptr) {
    throw ValueError(str_cat(origin, ": unknown key '", key, "'. Did you mean '", nearest_config_key(key),
                             "'? (`dtrain train --help` lists every key with its flag)"));
  }
  return *e;
}

// Walks a TOML table, applying every leaf; `prefix`: the dotted path so far.
void apply_table(TrainOptions& o, const toml::table& t, const std::string& prefix,
                 const std::string& origin) {
  for (const auto& [name, node] : t) {
    const std::string key = prefix.empty() ? std::string(name.str()) : str_cat(prefix, ".", name.str());
    if (const toml::table* sub = node.as_table()) {
      apply_table(o, *sub, key, origin);
      continue;
    }
    const Entry& e = entry_or_throw(key, origin);
    Value v{Kind::kString};
    std::ostringstream shown;
    if (auto x = node.as_integer()) {
      v.kind = Kind::kInt;
      v.i = x->get();
      shown << x->get();
    } else if (auto f = node.as_floating_point()) {
      v.kind = Kind::kFloat;
      v.d = f->get();
      shown << toml_double(f->get());
    } else if (auto s = node.as_string()) {
      v.kind = Kind::kString;
      v.s = s->get();
      shown << toml_string(s->get());
    } else if (auto b = node.as_boolean()) {
      v.kind = Kind::kBool;
      v.b = b->get();
      shown << (b->get() ? "true" : "false");
    } else {
      throw ValueError(str_cat(origin, ": ", key, " is ", node.is_array() ? "an array" : "a date or time",
                               "; it must be ", range_text(e.key), "."));
    }
    v.shown = shown.str();
    check_and_set(o, e, std::move(v), str_cat(origin, " (line ", node.source().begin.line, ")"));
  }
}

}  // namespace

const std::vector<ConfigKey>& config_schema() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> v;
    for (const auto& e : entries()) v.push_back(e.key);
    return v;
  }();
  return keys;
}

const ConfigKey* find_config_key(const std::string& key) {
  const Entry* e = find_entry(key);
  return e ? &e->key : nullptr;
}

std::string nearest_config_key(const std::string& key) {
  const auto dot = key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot), leaf = last_part(key);
  // a section within 2 edits of a real one ([optimiser]) narrows the search to that section's keys
  std::string in_section;
  size_t section_d = 3;
  for (const auto& e : entries()) {
    const std::string s = e.key.key.substr(0, e.key.key.find('.'));
    const size_t d = section.empty() ? 3 : edit_distance(section, s);
    if (d < section_d) section_d = d, in_section = s;
  }
  // an abbreviation (lr of learning_rate: the same first letter, its letters in order) counts as 1 edit
  auto abbreviates = [](const std::string& short_form, const std::string& long_form) {
    if (short_form.size() < 2 || short_form.size() >= long_form.size() || short_form[0] != long_form[0])
      return false;
    size_t i = 0;
    for (char c : long_form) i += i < short_form.size() && c == short_form[i];
    return i == short_form.size();
  };
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& e : entries()) {
    if (!in_section.empty() && e.key.key.rfind(in_section + ".", 0) != 0) continue;
    const std::string l = last_part(e.key.key);
    size_t d = std::min(edit_distance(key, e.key.key), edit_distance(leaf, l));
    if (abbreviates(l, leaf)) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = e.key.key;
  }
  return best;
}

void apply_config_file(TrainOptions& o, const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const std::string what(e.description());
    if (!e.source().begin) {  // (no position: the file could not be read)
      throw ValueError(
          str_cat("config ", path, " cannot be read: ", what, ". Name a TOML file that exists."));
    }
    throw ValueError(str_cat("config ", path, " is not valid TOML (line ", e.source().begin.line, ", column ",
                             e.source().begin.column, "): ", what, "."));
  }
  apply_table(o, t, "", str_cat("config ", path));
}

void apply_setting(TrainOptions& o, const std::string& key, const std::string& text,
                   const std::string& origin) {
  const Entry& e = entry_or_throw(key, origin);
  Value v{Kind::kString};
  v.shown = text;
  std::string body = text;
  if (body.size() >= 2 && (body.front() == '"' || body.front() == '\'') && body.back() == body.front()) {
    body = body.substr(1, body.size() - 2);  // a quoted string
    v.s = body;
    v.shown = toml_string(body);
  } else if (e.key.kind == Kind::kBool) {
    if (body == "true" || body == "1") {
      v.kind = Kind::kBool, v.b = true;
    } else if (body == "false" || body == "0") {
      v.kind = Kind::kBool, v.b = false;
    } else {
      v.s = body;
    }
  } else if (e.key.kind == Kind::kInt || e.key.kind == Kind::kBytes || e.key.kind == Kind::kFloat) {
    errno = 0;
    char* end = nullptr;
    const long long i = std::strtoll(body.c_str(), &end, 10);
    if (!body.empty() && end == body.c_str() + body.size() && errno == 0) {
      v.kind = Kind::kInt, v.i = i;
    } else {
      errno = 0;
      const double d = std::strtod(body.c_str(), &end);
      if (!body.empty() && end == body.c_str() + body.size() && errno == 0) {
        v.kind = Kind::kFloat, v.d = d;
      } else {
        v.s = body;  // text: a byte count such as 25M, or a wrong value the check names
      }
    }
  } else {
    v.s = body;
  }
  check_and_set(o, e, std::move(v), origin);
}

void apply_set(TrainOptions& o, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ValueError(str_cat("--set ", assignment, " is not key=value. Use e.g. --set optimizer.lr=3e-4."));
  }
  apply_setting(o, assignment.substr(0, eq), assignment.substr(eq + 1), str_cat("--set ", assignment));
}

std::string effective_config(const TrainOptions& o) {
  std::string out, section;
  for (const auto& e : entries()) {
    const auto dot = e.key.key.find('.');
    const std::string s = e.key.key.substr(0, dot);
    if (s != section) {
      out += str_cat(section.empty() ? "" : "\n", "[", s, "]\n");
      section = s;
    }
    out += str_cat(e.key.key.substr(dot + 1), " = ", e.access.get(o), "\n");
  }
  return out;
}

}  // namespace dtrain::train
