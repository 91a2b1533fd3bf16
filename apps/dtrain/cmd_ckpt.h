// `dtrain ckpt inspect DIR` (the manifest, readably, every checksum verified) and `dtrain ckpt export DIR
// OUT` (one consolidated safetensors file). One process; no ranks needed.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace dtrain::apps {

struct CkptOptions {
  std::string dir;
  std::string out;
  bool master_weights = false;
  bool no_verify = false;
};

// Adds `ckpt` with its `inspect` and `export` subcommands.
CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& opts);
// Runs whichever subcommand was parsed. Returns the exit code.
int run_ckpt(const CLI::App& ckpt, const CkptOptions& opts);

}  // namespace dtrain::apps
