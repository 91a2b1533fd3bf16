// The `dtrain run` subcommand: command-line options of the launcher (launch/launcher.h). Parsing only; main()
// calls dtrain::launch::run() when the subcommand was given.
#pragma once

#include <CLI/CLI.hpp>

#include "launch/launch_options.h"

namespace dtrain::apps {

// Registers `run` on `app`, writing into `opts` (which must outlive parsing):
//   dtrain run [-n N] [--backend gloo|mpi] [--nnodes N] [--node-rank R] [--master-addr A] [--master-port P]
//              [--max-restarts K] [--stop-grace SECONDS] [--] PROGRAM [ARGS...]
// Everything from PROGRAM on (or after `--`) is the command, unparsed, so the program's own flags pass
// through. Returns the subcommand, so that the caller can test `*sub` after parsing.
CLI::App* add_run_command(CLI::App& app, launch::LaunchOptions& opts);

}  // namespace dtrain::apps
