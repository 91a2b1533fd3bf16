// Command-line options of `dtrain plan` (apps/dtrain/gpt/plan_gpt.h): every option of `dtrain train`, and
// --world, --ranks-per-host, --backend and --json.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/dtrain/cmd_train.h"
#include "apps/dtrain/gpt/plan_gpt.h"

namespace dtrain::apps {

struct PlanCommand {
  TrainCommand train;
  train::PlanCommandOptions plan;
};

CLI::App* add_plan_command(CLI::App& app, PlanCommand& cmd);

}  // namespace dtrain::apps
