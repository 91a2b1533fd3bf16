// The collective benchmark behind `dtrain bench comm` and bench/comm_vs_engine: each collective over a range
// of sizes, timed as nccl-tests times it (the slowest rank's time per call; minimum and median over
// iterations; algorithm and bus bandwidth), and the alpha-beta profile fitted to it that the DTensor planner
// plans with (comm/cost_model.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/cost_model.h"
#include "plan/comm_bench_options.h"

namespace dtrain::plan {

// ValueError naming the bad option and value.
void validate(const CommBenchOptions& opts);

struct CommBenchRow {
  std::string op;
  int64_t bytes = 0;  // real bytes (count * element size)
  int64_t count = 0;  // elements
  int iters = 0;
  double min_s = 0, median_s = 0;
  double algbw_gbs = 0, busbw_gbs = 0;
};

// Runs every op at every size on `group` (collective: every rank calls it) and calls `on_row` on every rank
// for each (op, size) as it is measured. Returns the profile fitted per op (alpha + beta * bus bytes; ops
// with fewer than two sizes are left out).
comm::CommProfile run_comm_benchmark(comm::Backend& group, const CommBenchOptions& opts,
                                     const std::function<void(const CommBenchRow&)>& on_row);

// The element type named by --dtype (float32, float64, bfloat16, float16, int32, int64); ValueError
// otherwise.
at::ScalarType parse_bench_dtype(const std::string& name);

// Buffers for one op of `count` elements at `n` ranks (nccl-tests convention: all_gather's size is its
// output, reduce_scatter's its input; in-place ops use `in` only).
struct BenchBuffers {
  at::Tensor in, out;
};
BenchBuffers make_bench_buffers(const std::string& op, int64_t count, int n, at::ScalarType dtype);

// Runs collective `op` once on `b` and waits: in-place ops use `in`; the others write `out`.
void run_collective(comm::Backend& b, const std::string& op, at::Tensor& in, at::Tensor& out);

// Bus bandwidth factor of nccl-tests for `op` at `n` ranks (all_reduce 2(n-1)/n, gathers and scatters
// (n-1)/n, broadcast 1).
double bus_factor(const std::string& op, int n);

}  // namespace dtrain::plan
