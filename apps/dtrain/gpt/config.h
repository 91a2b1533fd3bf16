// The configuration of `dtrain train`: one schema of keys (TOML's section.key, the command-line flag that
// sets the same, the kind, the allowed range or values, and the help), read from a TOML file, from the flags
// and from `--set key=value`, in that order, each value checked as it comes:
//
//   [optimizer]
//   lr = 6e-3
//   [schedule]
//   name = "cosine"
//   warmup = 200
//
// An unknown key is an error naming the nearest valid key; a wrong type or a value out of range an error
// naming the key, the value and what is allowed. effective_config() writes every key back as TOML (what the
// run prints at its start and saves beside its checkpoints). A DeepSpeed JSON config maps onto the same keys
// (apps/dtrain/gpt/deepspeed_config.h).
#pragma once

#include <string>
#include <vector>

#include "apps/dtrain/gpt/train_gpt.h"

namespace dtrain::train {

struct ConfigKey {
  enum class Kind { kInt, kFloat, kString, kBool, kBytes };
  std::string key;   // "optimizer.lr"
  std::string flag;  // "--lr" ("" = the config and --set only)
  Kind kind = Kind::kInt;
  double min = 0, max = 0;           // ints, floats and bytes: the allowed range (inclusive)
  std::vector<std::string> choices;  // strings: the allowed values (empty: any text)
  std::string help;
};

// Every key, in the order effective_config() writes them.
const std::vector<ConfigKey>& config_schema();
const ConfigKey* find_config_key(const std::string& key);
// The valid key nearest to `key` (edit distance over the whole key and over its last part).
std::string nearest_config_key(const std::string& key);

// Applies every key of the TOML file `path`. ValueError naming the file and the key for an unknown key, a
// wrong type or a value out of range, and for a file that is not TOML (with the line).
void apply_config_file(TrainOptions& o, const std::string& path);
// Applies one value given as text (a flag's, or --set's after '='): `origin` names where it came from in
// messages ("--lr", "--set optimizer.lr=..."). ValueError as above.
void apply_setting(TrainOptions& o, const std::string& key, const std::string& value,
                   const std::string& origin);
// "key=value" of --set.
void apply_set(TrainOptions& o, const std::string& assignment);

// Every key and its value in `o`, as a TOML document grouped by section.
std::string effective_config(const TrainOptions& o);

}  // namespace dtrain::train
