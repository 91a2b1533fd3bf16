// Command-line options of `dtrain train`; see cmd_train.h.
#include "apps/dtrain/cmd_train.h"

#include <map>

#include "apps/dtrain/gpt/config.h"
#include "apps/dtrain/gpt/deepspeed_config.h"
#include "core/error.h"

namespace dtrain::apps {

CLI::App* add_train_command(CLI::App& app, TrainCommand& cmd) {
  CLI::App* c = app.add_subcommand(
      "train",
      "Train a GPT on text (one token per byte); run it inside `dtrain run`. Settings come from the "
      "defaults, "
      "then CONFIG (TOML, or a DeepSpeed JSON config), then the flags, then --set key=value, each later one "
      "winning; every flag below is also a key (shown in brackets) of the TOML file and of --set");
  add_train_options(c, cmd);
  return c;
}

void add_train_options(CLI::App* c, TrainCommand& cmd) {
  c->add_option("config", cmd.config,
                "A TOML config (sections model, data, train, strategy, precision, optimizer, schedule, "
                "checkpoint, eval, log, sample), or a DeepSpeed JSON config (*.json)");
  c->add_option("--set", cmd.sets, "key=value, e.g. --set optimizer.lr=3e-4 (TOML syntax for the value)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  c->add_option("--deepspeed", cmd.deepspeed,
                "A DeepSpeed JSON config (as the positional CONFIG when it ends in .json)");
  for (const auto& k : train::config_schema()) {
    if (k.flag.empty()) continue;
    const std::string help = str_cat(k.help, " [", k.key, "]");
    if (k.kind == train::ConfigKey::Kind::kBool) {
      c->add_flag_function(
          k.flag, [&cmd, key = k.key](int64_t) { cmd.flags[key] = "true"; }, help);
    } else {
      // a flag given twice takes its last value: scripts/main.sh's defaults, then the user's own
      c->add_option_function<std::string>(
           k.flag, [&cmd, key = k.key](const std::string& v) { cmd.flags[key] = v; }, help)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
}

train::TrainOptions train_options(const TrainCommand& cmd) {
  train::TrainOptions o;
  std::string deepspeed = cmd.deepspeed;
  if (!cmd.config.empty()) {
    const bool json = cmd.config.size() > 5 && cmd.config.compare(cmd.config.size() - 5, 5, ".json") == 0;
    if (json && !deepspeed.empty()) {
      throw ValueError(str_cat("train: two DeepSpeed configs, ", cmd.config, " and --deepspeed ", deepspeed,
                               ". Give one."));
    }
    if (json) {
      deepspeed = cmd.config;
    } else {
      train::apply_config_file(o, cmd.config);
    }
  }
  if (!deepspeed.empty()) train::apply_deepspeed_config(o, deepspeed);
  // (in the schema's order, each flag's last value)
  for (const auto& k : train::config_schema()) {
    const auto it = cmd.flags.find(k.key);
    if (it != cmd.flags.end()) train::apply_setting(o, k.key, it->second, k.flag + " " + it->second);
  }
  for (const auto& s : cmd.sets) train::apply_set(o, s);
  return o;
}

}  // namespace dtrain::apps
