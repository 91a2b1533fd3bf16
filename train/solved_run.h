// The Trainer's `--strategy solve` (issue 32; docs/planning.md, "Training by a solved plan"): the module runs
// on DTensors, every op of its training step placed by the whole-step sharding solver. At construction the
// module is distributed on the mesh (replicated), one step is recorded on it at micro-batches of 2 and 4 rows
// (the parameters, the optimizer's state and the random state put back afterwards), solved under the options'
// budget and constraints, and the parameters and the optimizer's state are placed as the plan says. Each
// step then runs under tensor::FollowPlan: the handler follows the plan op by op, or stops with an error
// naming the op where the step differs from the record.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "plan/solve_step.h"

namespace dtrain::mesh {
class DeviceMesh;
}

namespace dtrain::train {

struct TrainerOptions;

// The strategy's name (TrainerOptions::strategy, `dtrain train --strategy solve`).
inline constexpr char kSolveStrategy[] = "solve";

// Checks the options that strategy solve takes, or refuses (what is not built for it yet, or belongs to the
// hand-written layouts): ValueError or NotSupportedError naming the option and what to do.
void check_solve_options(const TrainerOptions& o);

class SolvedRun {
 public:
  using Batch = std::vector<at::Tensor>;
  using LossFn = std::function<at::Tensor(const Batch& rows)>;

  // `sample`: a global batch (the first step's), whose first rows the record runs on. Collective.
  SolvedRun(torch::nn::Module& model, LossFn loss, const Batch& sample, const TrainerOptions& o,
            comm::BackendPtr world);
  ~SolvedRun();

  // One optimizer step on the global batch `global` (the same on every rank), at learning rate `lr`: the
  // global mean loss; with clipping, the gradients' global norm before it in *grad_norm. Collective.
  double step(const Batch& global, double lr, double* grad_norm);

  torch::optim::Optimizer& optimizer() { return *opt_; }
  const plan::SolvedStep& solved() const { return solved_; }
  const std::shared_ptr<const mesh::DeviceMesh>& mesh() const { return mesh_; }
  // What rank 0 prints at the start: the mesh, the record, the solve and the predicted step.
  const std::string& summary() const { return summary_; }

 private:
  // The step as recorded and as run: zero_grad, each micro-batch's loss and backward, clipping, the
  // optimizer. `inputs[k]`: micro-batch k's tensors as DTensors. Keeps the losses and the norm as DTensors.
  void run(const std::vector<Batch>& inputs);
  // Micro-batch k of `global` (its rows [k*m, (k+1)*m)) as DTensors in `placements` (by input name), or
  // replicated where none is given.
  std::vector<Batch> inputs_of(const Batch& global, int64_t micro, bool planned) const;
  std::string describe(const comm::CostModel& comm) const;

  torch::nn::Module& model_;
  LossFn loss_;
  int64_t accumulation_ = 1;
  double clip_ = 0;
  std::shared_ptr<const mesh::DeviceMesh> mesh_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  std::vector<at::Tensor> params_;
  plan::SolvedStep solved_;
  std::vector<at::Tensor> losses_;  // the last run's, per micro-batch (DTensors)
  at::Tensor norm_;                 // the last run's gradient norm (a DTensor), with clipping
  std::string summary_;
};

// The input names a SolvedRun gives tensor i of micro-batch k ("batch0" for micro-batch 0, "batch0:1"
// after it): what --solve-pin names them by.
std::string solved_input_name(size_t tensor, int64_t micro);

}  // namespace dtrain::train
