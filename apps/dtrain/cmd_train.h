// Command-line options of `dtrain train` (train/train_gpt.h).
#pragma once

#include <CLI/CLI.hpp>

#include "train/train_gpt.h"

namespace dtrain::apps {

CLI::App* add_train_command(CLI::App& app, train::TrainOptions& opts);

}  // namespace dtrain::apps
