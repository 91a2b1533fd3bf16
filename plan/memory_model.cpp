// The model-state memory of each strategy; see memory_model.h.
#include "plan/memory_model.h"

namespace dtrain::plan {

double model_state_bytes_per_param(parallel::Strategy strategy, double sharing) {
  switch (strategy) {
    case parallel::Strategy::kDataParallel:
      return 16;
    case parallel::Strategy::kZero1:
      return 8 + 8 / sharing;
    case parallel::Strategy::kZero2:
      return 4 + 12 / sharing;
    case parallel::Strategy::kZero3:
    case parallel::Strategy::kHybridShard:
      return 16 / sharing;
  }
  return 16;
}

std::string model_state_formula(parallel::Strategy strategy) {
  switch (strategy) {
    case parallel::Strategy::kDataParallel:
      return "16 bytes each";
    case parallel::Strategy::kZero1:
      return "8 + 8/N bytes each";
    case parallel::Strategy::kZero2:
      return "4 + 12/N bytes each";
    case parallel::Strategy::kZero3:
    case parallel::Strategy::kHybridShard:
      return "16/N bytes each";
  }
  return "";
}

}  // namespace dtrain::plan
