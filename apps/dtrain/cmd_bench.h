// Command-line options of `dtrain bench comm`.
#pragma once

#include <CLI/CLI.hpp>

#include "apps/dtrain/bench_comm.h"

namespace dtrain::apps {

// Registers `bench` with its `comm` subcommand, filling `opts` when parsed (sizes such as "64M" are converted
// after parsing; a bad one is a ValueError). Returns the `bench comm` subcommand.
CLI::App* add_bench_command(CLI::App& app, BenchCommOptions& opts);


}  // namespace dtrain::apps
