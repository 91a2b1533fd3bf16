// `dtrain bench comm`: an nccl-tests-style table (size, count, min and median time, algorithm and bus
// bandwidth) for each collective over a range of sizes, run inside every rank of a job started by `dtrain
// run`. The measuring is plan/comm_benchmark's; this is the command's options and output. (No libtorch here:
// cmd_bench.cpp includes this header without it.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::apps {

struct BenchCommOptions {
  std::string backend;  // empty: comm::init() chooses
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};
  int64_t min_bytes = 1024;
  int64_t max_bytes = 64 << 20;
  int64_t step_factor = 4;  // sizes grow by this factor
  std::string dtype = "float32";
  int iters = 0;  // 0: chosen per size so that every size takes a similar time
  int warmup = 2;
  bool json = false;    // one JSON object per line instead of the table
  std::string profile;  // when set: fit alpha + beta * bus bytes per collective and write them there (JSON)
};

// Runs the benchmark (plan/comm_benchmark.h) in this rank of a job; rank 0 prints the table (or JSON lines)
// and writes the profile. ValueError naming a bad option.
int run_bench_comm(const BenchCommOptions& opts);

}  // namespace dtrain::apps
