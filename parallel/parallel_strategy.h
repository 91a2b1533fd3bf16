// One strategy of a Parallelized (parallelize.h), which composes them as an ordered list in the documented
// order (DESIGN §2): tensor parallel, activation checkpointing, then ZeRO (stages 1-3, hsdp) or data
// parallel. Each changed the module's parameters when it was built (its set-up), and then says three things:
//   - what it does around the step: zero_grad, gradient sync on or off (accumulation), finish_gradients once
//     the step's last backward is done, after_optimizer once the optimizer stepped;
//   - what it reports: its words for a parameter's placement, its gradient buckets, and, for the strategy
//     that holds the gradients, the model-state memory;
//   - for checkpoints and clipping, when it owns the tensors the optimizer steps on (ZeRO: this rank's
//     shards): those tensors, their layout in parameters, and what to do once a checkpoint wrote them.
// Each hook has a default that does nothing, so a strategy implements only what it does. A pipeline stage (a
// strategy that owns a subset of the modules and adds point-to-point sends) is one more implementation.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/data_parallel.h"

namespace dtrain::parallel {

class TensorParallel;

// A run of one parameter inside a tensor the optimizer steps on (checkpoint/training_state.h).
struct StateSegment {
  std::string param;              // the module's parameter name
  std::vector<int64_t> sizes;     // the parameter's shape on this rank (its tensor-parallel part)
  int64_t param_offset = 0;       // elements into it (row-major) where the run starts
  int64_t offset = 0, count = 0;  // elements into the given tensor (flattened)
};

// A gradient the optimizer steps on, with how many ranks hold the same values (optim::clip_grad_norm).
struct GradPart {
  at::Tensor grad;
  int64_t copies = 1;
};

// What the strategies before one (in the fixed order) did that it must know.
struct Composition {
  const TensorParallel* tp = nullptr;  // null with tp 1
  int64_t tp_size = 1;
  int64_t world_size = 1;
};

class ParallelStrategy {
 public:
  virtual ~ParallelStrategy() = default;
  virtual std::string name() const = 0;

  // Around the step.
  virtual void zero_grad() {}
  virtual void set_requires_gradient_sync(bool) {}
  virtual void finish_gradients() {}
  virtual void after_optimizer() {}

  // What it reports. A parameter's placement in words ("" when this strategy leaves it as it is).
  virtual std::string placement_of(const std::string& /*param*/) const { return ""; }
  virtual size_t bucket_count() const { return 0; }
  // The collectives it issues in each optimizer step, as CommLog records them (strategy_report.h). A tensor-
  // parallel block's collectives depend on the activations and on which tensors the module's forward reads
  // (colwise modules reading one tensor share one all-reduce): they are in CommLog under the module's name,
  // not here.
  virtual std::vector<StepCollective> step_collectives() const { return {}; }
  // The model-state memory, from the strategy that holds the gradients (nullopt: another one does).
  virtual std::optional<ModelStateMemory> memory(const torch::optim::Optimizer&) const {
    return std::nullopt;
  }

  // When it owns the optimizer's tensors: the optimizer (built at its set-up), else null.
  virtual torch::optim::Optimizer* optimizer() { return nullptr; }
  virtual std::vector<at::Tensor> given_tensors() const { return {}; }
  virtual std::vector<std::vector<StateSegment>> state_layout() const { return {}; }
  virtual std::vector<GradPart> gradient_parts(const Composition&) const { return {}; }
  // After a checkpoint was loaded into the given tensors. Collective.
  virtual void given_tensors_changed() {}
};

}  // namespace dtrain::parallel
