// `dtrain explain`: prints the redistribution plan the DTensor planner chooses for a tensor on a mesh, next
// to the naive route (gather everything, then re-shard). Pure: runs no ranks.
// `dtrain explain solve`: records the GPT's training step, solves its layout for a mesh with the whole-step
// sharding solver and explains the plan (apps/dtrain/gpt/solve_gpt.h).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "apps/dtrain/cmd_train.h"
#include "apps/dtrain/gpt/solve_gpt.h"

namespace dtrain::apps {

struct ExplainOptions {
  std::string mesh = "2,2";  // axis sizes
  std::string shape = "1024,1024";
  std::string from, to;  // placements, one per axis: "S(0),P(sum)"
  std::string dtype = "float32";
  std::string profile;  // a `dtrain bench comm --profile` file; the built-in defaults otherwise
  // explain solve
  CLI::App* solve_command = nullptr;
  TrainCommand train;
  std::string budget, compare_budget;  // bytes ("8M")
  std::vector<std::string> pins;       // NAME=PLACEMENTS
  int batch_axis = -1;
};

CLI::App* add_explain_command(CLI::App& app, ExplainOptions& opts);
// Prints the plan; ValueError for bad input.
int run_explain(const ExplainOptions& opts);

}  // namespace dtrain::apps
