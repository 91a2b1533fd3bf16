// The whole-step sharding solver on the built-in GPT (`dtrain explain solve`, docs/planning.md "Explaining a
// solved step"): records the run's training step (the GPT with AdamW, at the run's global batch, from two
// small batches) on one process, builds the solver's graph for a mesh, solves it under a memory budget and
// explains the plan; with a second budget, sets the two plans side by side.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "apps/dtrain/gpt/train_gpt.h"

namespace dtrain::train {

struct SolveOptions {
  std::vector<int64_t> mesh{2};  // the mesh to plan for
  double budget = 0;             // bytes per rank (0: none)
  double compare_budget = 0;     // a second plan under this budget, set beside the first (0: none)
  std::string profile;           // a `dtrain bench comm --profile` file ("": the built-in cost model)
  // Constraints: (parameter name, placements) pairs ("h0.mlp.fc.weight", "S(0)"); and the mesh axis the
  // batch stays sharded over (the inputs, `tokens` and `targets`, S(0) on it and R on the others; -1: free).
  std::vector<std::pair<std::string, std::string>> pins;
  int batch_axis = -1;
};

// The explanation, as printed. ValueError for a budget no plan fits (naming it and the least any plan needs).
std::string solve_gpt(const TrainOptions& o, const SolveOptions& s);

}  // namespace dtrain::train
