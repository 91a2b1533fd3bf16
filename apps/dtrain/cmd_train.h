// Command-line options of `dtrain train` (apps/dtrain/gpt/train_gpt.h): a config file (TOML, or DeepSpeed's
// JSON), one flag per key of apps/dtrain/gpt/config.h's schema, and --set key=value.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "apps/dtrain/gpt/train_gpt.h"

namespace dtrain::apps {

struct TrainCommand {
  std::string config;                        // the positional TOML (or .json: DeepSpeed) file
  std::string deepspeed;                     // --deepspeed FILE
  std::map<std::string, std::string> flags;  // key -> the flag's (last) value
  std::vector<std::string> sets;             // --set key=value, in order
};

CLI::App* add_train_command(CLI::App& app, TrainCommand& cmd);
// The options of `dtrain train` on `c` (also `dtrain plan`'s).
void add_train_options(CLI::App* c, TrainCommand& cmd);

// The defaults, then the config file, then the flags, then --set. ValueError naming the source, key and
// value.
train::TrainOptions train_options(const TrainCommand& cmd);

}  // namespace dtrain::apps
