// `dtrain bench comm`: an nccl-tests-style table (size, count, min and median time, algorithm and bus
// bandwidth) for each collective over a range of sizes, run inside every rank of a job started by `dtrain
// run`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Declared only: cmd_bench.cpp includes this header without libtorch on its include path.
namespace at {
class Tensor;
}
namespace dtrain::comm {
class Backend;
}

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

// Validates the options (ValueError naming the bad value) and runs the benchmark; rank 0 prints.
int run_bench_comm(const BenchCommOptions& opts);

// Runs collective `op` ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all") once on `b`
// and waits: in-place ops use `in`; the others write `out` (sized as make_bench_buffers does).
void run_collective(comm::Backend& b, const std::string& op, at::Tensor& in, at::Tensor& out);

// Bus bandwidth factor of nccl-tests for `op` at `n` ranks (all_reduce 2(n-1)/n, gathers and scatters
// (n-1)/n, broadcast 1).
double bus_factor(const std::string& op, int n);

}  // namespace dtrain::apps
