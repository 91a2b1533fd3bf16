// `dtrain explain`: prints the redistribution plan the DTensor planner chooses for a tensor on a mesh, next
// to the naive route (gather everything, then re-shard). Pure: runs no ranks.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace dtrain::apps {

struct ExplainOptions {
  std::string mesh = "2,2";  // axis sizes
  std::string shape = "1024,1024";
  std::string from, to;  // placements, one per axis: "S(0),P(sum)"
  std::string dtype = "float32";
  std::string profile;  // a `dtrain bench comm --profile` file; the built-in defaults otherwise
};

CLI::App* add_explain_command(CLI::App& app, ExplainOptions& opts);
// Prints the plan; ValueError for bad input.
int run_explain(const ExplainOptions& opts);

}  // namespace dtrain::apps
