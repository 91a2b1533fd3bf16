// `dtrain bench comm`: an nccl-tests-style table (size, count, min and median time, algorithm and bus
// bandwidth) for each collective over a range of sizes, run inside every rank of a job started by `dtrain
// run`. The measuring is plan/comm_benchmark's; this is the command's options and output. (No libtorch here:
// cmd_bench.cpp includes this header without it.)
#pragma once

#include <string>

#include "plan/comm_bench_options.h"

namespace dtrain::apps {

struct BenchCommOptions {
  std::string backend;           // empty: comm::init() chooses
  plan::CommBenchOptions sweep;  // the collectives, sizes, dtype and iterations
  bool json = false;             // one JSON object per line instead of the table
  std::string profile;  // when set: fit alpha + beta * bus bytes per collective and write them there (JSON)
};

// Runs the benchmark (plan/comm_benchmark.h) in this rank of a job; rank 0 prints the table (or JSON lines)
// and writes the profile. ValueError naming a bad option.
int run_bench_comm(const BenchCommOptions& opts);

}  // namespace dtrain::apps
