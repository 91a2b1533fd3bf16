// The model-state memory of each strategy (DESIGN §5), per parameter and per rank, for fp32 AdamW: weights,
// gradients and two moments, 16 bytes a parameter when nothing is sharded (under 16-bit precision the 2-byte
// weights and gradients plus fp32 masters and moments, also 16). `sharing` is the number of ranks one copy
// is sharded over (the data-parallel ranks, or hsdp's shard group).
//
//   dp      16            zero2   4 + 12/N
//   zero1   8 + 8/N       zero3 and hsdp   16/N
#pragma once

#include <string>

#include "parallel/strategy.h"

namespace dtrain::plan {

double model_state_bytes_per_param(parallel::Strategy strategy, double sharing);
// The formula above, for reports: "4 + 12/N bytes each".
std::string model_state_formula(parallel::Strategy strategy);

}  // namespace dtrain::plan
