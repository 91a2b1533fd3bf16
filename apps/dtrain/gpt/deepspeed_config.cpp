// DeepSpeed's JSON config mapped onto dtrain's keys; see deepspeed_config.h.
#include "apps/dtrain/gpt/deepspeed_config.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "apps/dtrain/gpt/config.h"
#include "core/error.h"

namespace dtrain::train {

namespace {

using nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

class Mapper {
 public:
  Mapper(TrainOptions& o, std::string path) : o_(o), path_(std::move(path)) {}

  void run(const json& doc) {
    if (!doc.is_object()) fail("", "the file must hold one JSON object");
    for (const auto& [key, value] : doc.items()) top(key, value);
    finish();
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw ValueError(str_cat("deepspeed config ", path_, key.empty() ? "" : str_cat(": ", key), ": ", why));
  }
  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }
  // The value as text for apply_setting (numbers and booleans as JSON writes them).
  static std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
  void set(const std::string& ds_key, const std::string& key, const json& v) {
    if (is_auto(v)) return;  // keep dtrain's value
    apply_setting(o_, key, text(v),
                  str_cat("deepspeed config ", path_, ": ", ds_key, " (dtrain's ", key, ")"));
  }
  // A boolean DeepSpeed accepts and dtrain cannot change: accepted, with a note of what dtrain does.
  void fixed(const std::string& ds_key, const json& v, const std::string& what) {
    if (!v.is_boolean() && !is_auto(v)) fail(ds_key, str_cat(v.dump(), " is not true or false"));
    o_.config_notes.push_back(str_cat(ds_key, " = ", v.dump(), ": ", what));
  }
  void unsupported(const std::string& ds_key, const std::string& why) const {
    fail(ds_key, str_cat("not supported by dtrain (", why, "). Remove it."));
  }
  static std::vector<std::string> keys_of(const json& v) {
    std::vector<std::string> out;
    for (const auto& [k, _] : v.items()) out.push_back(k);
    return out;
  }

  void top(const std::string& key, const json& v) {
    if (key == "train_batch_size") {
      set(key, "train.batch", v);
    } else if (key == "train_micro_batch_size_per_gpu") {
      set(key, "train.micro_batch", v);
    } else if (key == "gradient_accumulation_steps") {
      set(key, "train.accumulation", v);
    } else if (key == "gradient_clipping") {
      set(key, "train.clip", v);
    } else if (key == "steps_per_print") {
      set(key, "log.every", v);
    } else if (key == "wall_clock_breakdown") {
      if (v.is_boolean() && v.get<bool>()) {
        unsupported(key, "per-phase timings: use --metrics, whose lines hold each step's time and tokens/s");
      }
      fixed(key, v, "off (dtrain's --metrics file has each step's time)");
    } else if (key == "optimizer") {
      optimizer(v);
    } else if (key == "scheduler") {
      scheduler(v);
    } else if (key == "fp16") {
      fp16(v);
    } else if (key == "bf16" || key == "bfloat16") {
      bf16(key, v);
    } else if (key == "zero_optimization") {
      zero(v);
    } else if (key == "zero_allow_untested_optimizer") {
      fixed(key, v, "dtrain's ZeRO takes any optimizer built by its factory (AdamW here)");
    } else {
      unsupported(key,
                  "dtrain reads train_batch_size, train_micro_batch_size_per_gpu, "
                  "gradient_accumulation_steps, gradient_clipping, steps_per_print, wall_clock_breakdown, "
                  "optimizer, scheduler, fp16, bf16 and zero_optimization");
    }
  }

  void optimizer(const json& v) {
    if (!v.is_object()) fail("optimizer", "must be an object with type and params");
    const std::string type = v.contains("type") ? lower(text(v["type"])) : "";
    if (type != "adam" && type != "adamw") {
      fail("optimizer.type",
           str_cat(v.value("type", json("(missing)")).dump(),
                   " is not an optimizer dtrain has. Use \"Adam\" or \"AdamW\" (both AdamW: "
                   "decoupled weight decay, as DeepSpeed's Adam with adam_w_mode true)"));
    }
    for (const auto& k : keys_of(v)) {
      if (k != "type" && k != "params")
        unsupported("optimizer." + k, "an optimizer block holds type and params");
    }
    bool adam_w_mode = true;
    double weight_decay = 0;  // DeepSpeed's Adam default
    if (v.contains("params")) {
      const json& p = v["params"];
      if (!p.is_object()) fail("optimizer.params", "must be an object");
      for (const auto& [k, x] : p.items()) {
        const std::string name = "optimizer.params." + k;
        if (k == "lr") {
          set(name, "optimizer.lr", x);
        } else if (k == "eps") {
          set(name, "optimizer.eps", x);
        } else if (k == "weight_decay") {
          if (x.is_number()) weight_decay = x.get<double>();
        } else if (k == "betas") {
          if (is_auto(x)) continue;
          if (!x.is_array() || x.size() != 2) fail(name, str_cat(x.dump(), " must be a pair [beta1, beta2]"));
          set(name + "[0]", "optimizer.beta1", x[0]);
          set(name + "[1]", "optimizer.beta2", x[1]);
        } else if (k == "adam_w_mode") {
          if (!x.is_boolean()) fail(name, str_cat(x.dump(), " is not true or false"));
          adam_w_mode = x.get<bool>();
        } else if (k == "torch_adam") {
          fixed(name, x, "dtrain's AdamW is libtorch's (torch::optim::AdamW)");
        } else if (k == "bias_correction") {
          if (!x.is_boolean() || !x.get<bool>()) unsupported(name, "AdamW always corrects its moments' bias");
        } else {
          unsupported(name, "AdamW's params are lr, betas, eps, weight_decay (and adam_w_mode, torch_adam)");
        }
      }
      if (p.contains("weight_decay"))
        set("optimizer.params.weight_decay", "optimizer.weight_decay", p["weight_decay"]);
      else
        set("optimizer.params.weight_decay", "optimizer.weight_decay", json(0.0));
    } else {
      set("optimizer.params.weight_decay", "optimizer.weight_decay", json(0.0));
    }
    if (type == "adam" && !adam_w_mode && weight_decay != 0) {
      unsupported(
          "optimizer.params.adam_w_mode",
          "Adam with L2 regularisation (adam_w_mode false and a weight decay); dtrain's AdamW decays the "
          "weights decoupled: set adam_w_mode true, or weight_decay 0");
    }
  }

  void scheduler(const json& v) {
    if (!v.is_object()) fail("scheduler", "must be an object with type and params");
    const std::string type = v.contains("type") ? text(v["type"]) : "";
    if (type != "WarmupLR" && type != "WarmupDecayLR") {
      fail("scheduler.type", str_cat(v.value("type", json("(missing)")).dump(),
                                     " is not a schedule dtrain has. Use \"WarmupLR\" or \"WarmupDecayLR\""));
    }
    for (const auto& k : keys_of(v)) {
      if (k != "type" && k != "params")
        unsupported("scheduler." + k, "a scheduler block holds type and params");
    }
    // DeepSpeed's defaults: from 0, 1000 steps, logarithmic
    apply_setting(o_, "schedule.name", type == "WarmupLR" ? "constant" : "linear",
                  "deepspeed config scheduler.type");
    json p = v.value("params", json::object());
    if (!p.is_object()) fail("scheduler.params", "must be an object");
    json min_lr = p.value("warmup_min_lr", json(0.0)), steps = p.value("warmup_num_steps", json(1000)),
         kind = p.value("warmup_type", json("log"));
    for (const auto& [k, x] : p.items()) {
      const std::string name = "scheduler.params." + k;
      if (k == "warmup_max_lr") {
        set(name, "optimizer.lr", x);
      } else if (k == "total_num_steps") {
        if (type != "WarmupDecayLR") unsupported(name, "WarmupLR has no total; use WarmupDecayLR");
        set(name, "train.steps", x);
      } else if (k == "last_batch_iteration") {
        if (!x.is_number_integer() || x.get<int64_t>() != -1) {
          unsupported(name, "a schedule that starts part-way: resume a checkpoint instead (--resume)");
        }
      } else if (k != "warmup_min_lr" && k != "warmup_num_steps" && k != "warmup_type") {
        unsupported(name,
                    "WarmupLR's and WarmupDecayLR's params are warmup_min_lr, warmup_max_lr, "
                    "warmup_num_steps, warmup_type (and total_num_steps)");
      }
    }
    if (!is_auto(steps)) {  // (DeepSpeed warms up over at least 2 steps)
      if (!steps.is_number_integer() || steps.get<int64_t>() < 1) {
        fail("scheduler.params.warmup_num_steps", str_cat(steps.dump(), " must be a positive integer"));
      }
      set("scheduler.params.warmup_num_steps", "schedule.warmup",
          json(std::max<int64_t>(2, steps.get<int64_t>())));
    }
    set("scheduler.params.warmup_min_lr", "schedule.warmup_min_lr", min_lr);
    set("scheduler.params.warmup_min_lr", "schedule.min_lr", min_lr);  // WarmupDecayLR decays back to it
    set("scheduler.params.warmup_type", "schedule.warmup_type", kind);
    o_.config_notes.push_back(
        "scheduler: dtrain's step s takes DeepSpeed's iteration s - 1 (DeepSpeed's engine applies each value "
        "one step later)");
  }

  void fp16(const json& v) {
    if (!v.is_object()) fail("fp16", "must be an object");
    const json enabled = v.value("enabled", json(false));
    if (!is_auto(enabled)) {
      if (!enabled.is_boolean())
        fail("fp16.enabled", str_cat(enabled.dump(), " is not true, false or \"auto\""));
      if (!enabled.get<bool>()) return;  // DeepSpeed ignores the rest of a disabled block
      apply_setting(o_, "precision.dtype", "fp16", "deepspeed config fp16.enabled");
    }
    for (const auto& [k, x] : v.items()) {
      const std::string name = "fp16." + k;
      if (k == "enabled") continue;
      if (k == "loss_scale") {
        set(name, "precision.loss_scale", x);
      } else if (k == "initial_scale_power") {
        set(name, "precision.initial_scale_power", x);
      } else if (k == "loss_scale_window") {
        set(name, "precision.loss_scale_window", x);
      } else if (k == "hysteresis") {
        set(name, "precision.hysteresis", x);
      } else if (k == "consecutive_hysteresis") {
        set(name, "precision.consecutive_hysteresis", x);
      } else if (k == "min_loss_scale") {
        set(name, "precision.min_loss_scale", x);
      } else if (k == "auto_cast") {
        if (x.is_boolean() && x.get<bool>()) unsupported(name, "autocast: dtrain casts the model itself");
        fixed(name, x, "the model computes in fp16 with fp32 master weights in the optimizer");
      } else if (k == "fp16_master_weights_and_grads") {
        if (x.is_boolean() && x.get<bool>())
          unsupported(name, "dtrain keeps fp32 master weights and gradients");
        fixed(name, x, "fp32 master weights and gradients, as DeepSpeed's default");
      } else {
        unsupported(name,
                    "the fp16 block's fields are enabled, loss_scale, initial_scale_power, "
                    "loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale, auto_cast");
      }
    }
  }

  void bf16(const std::string& block, const json& v) {
    if (!v.is_object()) fail(block, "must be an object");
    for (const auto& [k, x] : v.items()) {
      const std::string name = block + "." + k;
      if (k == "enabled") {
        if (is_auto(x)) continue;
        if (!x.is_boolean()) fail(name, str_cat(x.dump(), " is not true, false or \"auto\""));
        if (x.get<bool>()) apply_setting(o_, "precision.dtype", "bf16", "deepspeed config " + name);
      } else if (k == "bf16_master_weights_and_grads" || k == "bf16_optimizer_states") {
        if (x.is_boolean() && x.get<bool>())
          unsupported(name, "dtrain keeps fp32 masters and optimizer state");
        fixed(name, x, "fp32 master weights and optimizer state");
      } else {
        unsupported(name, "the bf16 block's field is enabled");
      }
    }
  }

  void zero(const json& v) {
    if (v.is_boolean()) {  // DeepSpeed's early form: true is stage 1
      apply_setting(o_, "strategy.name", "deepspeed", "deepspeed config zero_optimization");
      apply_setting(o_, "strategy.zero_stage", v.get<bool>() ? "1" : "0",
                    "deepspeed config zero_optimization");
      return;
    }
    if (!v.is_object()) fail("zero_optimization", "must be an object (or true / false)");
    apply_setting(o_, "strategy.name", "deepspeed", "deepspeed config zero_optimization");
    apply_setting(o_, "strategy.zero_stage", "0", "deepspeed config zero_optimization (stage 0 by default)");
    std::optional<double> reduce, gather;
    for (const auto& [k, x] : v.items()) {
      const std::string name = "zero_optimization." + k;
      if (k == "stage") {
        set(name, "strategy.zero_stage", x);
      } else if (k == "reduce_bucket_size" || k == "allgather_bucket_size") {
        if (is_auto(x)) continue;
        if (!x.is_number() || x.get<double>() < 1 || x.get<double>() > 1e12) {
          fail(name, str_cat(x.dump(), " must be a number of elements from 1 to 1e12"));
        }
        (k == "reduce_bucket_size" ? reduce : gather) = x.get<double>();
      } else if (k == "overlap_comm") {
        fixed(name, x, "dtrain always sends each gradient bucket as soon as backward fills it");
      } else if (k == "contiguous_gradients") {
        fixed(name, x, "dtrain always keeps the gradients in contiguous buckets");
      } else if (k == "reduce_scatter") {
        fixed(name, x, "ZeRO stages 1-3 reduce-scatter the gradients; stage 0 all-reduces them");
      } else if (k == "allgather_partitions") {
        fixed(name, x, "ZeRO stages 1 and 2 all-gather the updated shards after each step");
      } else if (k == "load_from_fp32_weights") {
        fixed(name, x, "dtrain's checkpoints hold the fp32 masters and load them");
      } else if (k == "ignore_unused_parameters") {
        fixed(name, x, "parameters without gradients are allowed");
      } else if (k == "round_robin_gradients") {
        if (x.is_boolean() && x.get<bool>()) unsupported(name, "round-robin gradient partitioning");
        fixed(name, x, "off");
      } else if (k.rfind("offload_", 0) == 0 || k == "cpu_offload") {
        unsupported(name, "CPU offload is not built yet");
      } else {
        unsupported(name,
                    "dtrain's ZeRO reads stage, reduce_bucket_size and allgather_bucket_size (and accepts "
                    "overlap_comm, contiguous_gradients, reduce_scatter, allgather_partitions, "
                    "load_from_fp32_weights, ignore_unused_parameters, round_robin_gradients)");
      }
    }
    if (reduce && gather && *reduce != *gather) {
      fail("zero_optimization.allgather_bucket_size",
           str_cat(*gather, " differs from reduce_bucket_size ", *reduce,
                   ": dtrain uses one bucket size for both (the gradient buckets and the parameters gathered "
                   "together). Give them the same value"));
    }
    if (reduce || gather) {
      bucket_elements_ = reduce ? *reduce : *gather;
    }
  }

  void finish() {
    if (bucket_elements_ > 0) {  // elements of the gradients' reduction dtype
      const std::string dtype = !o_.reduce_dtype.empty() ? o_.reduce_dtype : o_.precision;
      const int64_t bytes = static_cast<int64_t>(bucket_elements_) * (dtype == "fp32" ? 4 : 2);
      apply_setting(o_, "strategy.bucket_bytes", std::to_string(bytes),
                    str_cat("deepspeed config ", path_, ": zero_optimization bucket size ", bucket_elements_,
                            " elements of ", dtype));
    }
  }

  TrainOptions& o_;
  std::string path_;
  double bucket_elements_ = 0;
};

}  // namespace

void apply_deepspeed_config(TrainOptions& o, const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ValueError(str_cat("deepspeed config ", path, " cannot be read. Name a JSON file that exists."));
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    throw ValueError(
        str_cat("deepspeed config ", path, " is not valid JSON (byte ", e.byte, "): ", e.what()));
  }
  Mapper(o, path).run(doc);
}

}  // namespace dtrain::train
