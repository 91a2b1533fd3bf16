// What the collective benchmark (plan/comm_benchmark.h) measures. No libtorch here: `dtrain bench comm`'s
// option parsing includes it without libtorch on its include path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::plan {

struct CommBenchOptions {
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};
  int64_t min_bytes = 1024;
  int64_t max_bytes = 64 << 20;
  int64_t step_factor = 4;  // sizes grow by this factor
  std::string dtype = "float32";
  int iters = 0;  // 0: chosen per size so that every size takes a similar time
  int warmup = 2;
};

}  // namespace dtrain::plan
