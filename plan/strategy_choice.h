// The strategy `auto` picks (`dtrain train --strategy auto`): from the memory model (plan/memory_model.h),
// the first of dp, zero2 and zero3 whose model state fits in half the memory available per rank on the node
// (the other half left for activations and the allocator). A rule, not yet a search over measured costs.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/strategy.h"

namespace dtrain::plan {

struct StrategyInputs {
  int64_t params = 0;          // the model's parameters, whole
  int64_t tp = 1;              // tensor-parallel degree (each rank holds params / tp)
  int64_t data_parallel = 1;   // data-parallel ranks
  double available_bytes = 0;  // memory available on the node (the smallest over the ranks' nodes)
  int64_t ranks_on_node = 1;   // ranks sharing that memory
};

struct StrategyChoice {
  parallel::Strategy strategy = parallel::Strategy::kDataParallel;
  // Why, with the figures: "zero2 (model state: dp 512 MiB, zero2 160 MiB, zero3 128 MiB per rank, against
  // half of the 300 MiB available per rank)".
  std::string reason;
};

// ValueError for inputs that are not positive.
StrategyChoice choose_strategy(const StrategyInputs& in);

}  // namespace dtrain::plan
