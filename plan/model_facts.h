// What the planner needs to know of a model besides its compute (plan/compute_model.h): its parameters,
// which of them the tensor-parallel plan splits, the degrees it allows, and what else the run holds.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/tensor_parallel.h"
#include "plan/compute_model.h"

namespace dtrain::plan {

struct ParamFact {
  std::string name;
  int64_t numel = 0;
  // Its placement on the tensor-parallel axis in DTensor notation ("Shard(0)", "Shard(1)", "Replicate()"):
  // a split parameter holds numel / tp elements per rank.
  std::string tp_placement = "Replicate()";
};

struct ModelFacts {
  std::string description;
  std::vector<ParamFact> params;    // in registration order
  int64_t element_bytes = 4;        // the parameters' dtype
  std::vector<int64_t> tp_degrees;  // the tensor-parallel degrees the model's plan allows (empty: none)
  bool can_checkpoint = false;
  bool can_sequence_parallel = false;  // the tp plan has a working sequence-parallel form
  int64_t data_bytes = 0;              // tensors the run holds besides the model and its step (the dataset)
  std::optional<TransformerShape> shape;  // for compute counted from the shape (a cluster not here)

  int64_t total_params() const;
  // Elements a rank holds under a tp-way split.
  int64_t params_per_rank(int64_t tp) const;
};

// The facts of `module` under `plan` (each parameter's tp placement from its module's style; degrees: those
// given). The dtype from the parameters.
ModelFacts model_facts(torch::nn::Module& module, const parallel::TensorParallelPlan& plan,
                       std::vector<int64_t> tp_degrees, bool can_checkpoint, int64_t data_bytes,
                       std::string description);

}  // namespace dtrain::plan
