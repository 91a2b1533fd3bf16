// parallelize(): one entry point that applies a whole parallel configuration to a user's module, in one
// fixed, documented order (DESIGN §2: tensor parallel, then activation checkpointing, then ZeRO/FSDP, then
// data parallel), validating every degree up front. The
// data-parallel strategies (dp, zero1, zero2, zero3 over the whole group; hsdp: zero3 within groups of
// shard_size consecutive ranks, replicated across the groups, on a [replicas, shard_size] mesh); with tp > 1,
// a [dp, tp] mesh (tp consecutive ranks form a tensor-parallel group): the plan's styles over the tp axis
// (parallel/tensor_parallel.h), then the strategy (dp, zero1-3) over the dp axis.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "parallel/parallel_strategy.h"
#include "parallel/strategy.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"

namespace dtrain::mesh {
class DeviceMesh;
}

namespace dtrain::parallel {

struct ParallelConfig {
  std::string strategy = "dp";  // parse_strategy's names
  int64_t tp = 1;               // tensor-parallel degree
  TensorParallelPlan tp_plan;   // tp > 1: the styles
  int64_t shard_size = 0;       // hsdp: ranks per ZeRO-3 group (0: not set)
  GradReductionOptions
      reduction;              // how gradients are reduced: bucket sizes, allow_unused, dtype, deterministic
  MaterializeFn materialize;  // zero3, hsdp: a meta tensor's values (ZeroOptions::materialize)
  // Activation checkpointing: module-name patterns ("h*": '*' within one name component) whose modules
  // recompute their activations in backward (parallel/activation_checkpointing.h). Each must derive
  // nn::ActivationCheckpointable (models::GPT's blocks do); libtorch's C++ modules have no forward hooks to
  // wrap others.
  std::vector<std::string> activation_checkpointing;
  // The mesh's axes, outermost first; the last axis's groups are consecutive ranks (one host, as a rule), the
  // first's are strided across hosts. Empty: {"dp", "tp"} with tp > 1, {"replicate", "shard"} under hsdp.
  // {"tp", "dp"} or {"shard", "replicate"} lays the other axis inside a host (validate_mesh_order).
  std::vector<std::string> mesh_order;
};

// The layout's mesh axes, outermost first, in `config.mesh_order` when set: {"dp", "tp"} with tp > 1,
// {"replicate", "shard"} under hsdp, none otherwise. ValueError naming the order when it is not a
// permutation of those axes.
std::vector<std::string> validate_mesh_order(const ParallelConfig& config);

// Checks `config` against the world size before anything is built: the strategy's name, the degrees (tp and
// shard_size divide the world size; shard_size only with hsdp), and what is not built yet. ValueError or
// NotSupportedError naming the values. Pure.
Strategy validate_parallel_config(const ParallelConfig& config, int64_t world_size);

// A module under its strategies, composed as an ordered list (parallel_strategy.h) in the fixed order: tensor
// parallel (tp > 1), activation checkpointing (when asked), then ZeRO (stages 1-3, hsdp) or data parallel,
// or, with one data-parallel rank, a plain optimizer over the module's parameters. The last one owns the
// optimizer (over the module's parameters, or this rank's shards): the training loop calls zero_grad(),
// backward, step().
class Parallelized {
 public:
  Parallelized(torch::nn::Module& module, comm::BackendPtr world, const ParallelConfig& config,
               const OptimizerFactory& make);
  ~Parallelized();
  Strategy strategy() const { return strategy_; }
  // The strategies, in the order they were applied.
  const std::vector<std::unique_ptr<ParallelStrategy>>& strategies() const { return strategies_; }
  void zero_grad();
  // Finishes this step's gradients (sequence parallel: sums the whole parameters' over the tp group), once
  // per step; step() and optim::clip_grad_norm call it.
  void finish_gradients();
  // The optimizer's step; `after_optimizer` (if given) runs right after it, before ZeRO all-gathers the
  // parameters from the shards (mixed precision copies its fp32 masters into the shards there).
  void step(const std::function<void()>& after_optimizer = {});
  // Gradient accumulation: false for every micro-step but the last.
  void set_requires_gradient_sync(bool sync);
  ModelStateMemory memory() const;
  torch::optim::Optimizer& optimizer();
  size_t bucket_count() const;
  // Every strategy's collectives per optimizer step, in the composition's order (strategy_report.h).
  std::vector<StepCollective> step_collectives() const;
  // The data-parallel strategy, for reduce_with_gradients and last_pass (null under ZeRO, and under tensor
  // parallel alone).
  DataParallel* data_parallel();
  // The tensor-parallel layout (null with tp 1).
  TensorParallel* tensor_parallel();
  // The gradients the optimizer steps on (the module's parameters', or this rank's shards'), each with how
  // many ranks hold the same values: over the world, the sum of |g|^2 / copies is the whole gradient's
  // |g|^2, without gathering any gradient (optim::clip_grad_norm). Call after the last backward of a step.
  // Under ZeRO with tp > 1 a shard mixes tensor-parallel parts and whole parameters: one part per run.
  using GradPart = parallel::GradPart;
  std::vector<GradPart> gradient_parts() const;
  const comm::BackendPtr& world() const { return world_; }
  // Deterministic mode (GradReductionOptions::deterministic): bitwise the same results at any power-of-2
  // world size.
  bool deterministic() const { return deterministic_; }
  // ZeRO: Zero::gradient_block_squares, optim::clip_grad_norm's norm in deterministic mode.
  at::Tensor gradient_block_squares() const;
  // What a checkpoint saves (checkpoint/training_state.h): the tensors the optimizer factory was given (the
  // module's parameters, or this rank's ZeRO shards), and for each of them the runs of parameters it holds.
  using StateSegment = parallel::StateSegment;
  std::vector<at::Tensor> given_tensors() const;
  std::vector<std::vector<StateSegment>> state_layout() const;
  // After a checkpoint was loaded into the given tensors: ZeRO's parameters made to match their shards.
  // Collective.
  void given_tensors_changed();
  // Each strategy's words for the parameter's placement, joined ("Shard(0) over tp 2, Replicate over dp 2").
  std::string placement_of(const std::string& param) const;
  // The mesh: [dp, tp] with tp > 1, [replicas, shard_size] under hsdp (axes in ParallelConfig::mesh_order);
  // null otherwise.
  const std::shared_ptr<mesh::DeviceMesh>& mesh() const { return mesh_; }
  // The ranks that split the batch (the world with tp 1): this rank's data-parallel index is its group rank.
  const comm::BackendPtr& data_parallel_group() const { return dp_group_; }

 private:
  // The last strategy, which owns the optimizer and its tensors.
  ParallelStrategy& owner() const { return *strategies_.back(); }

  Strategy strategy_;
  comm::BackendPtr world_;
  comm::BackendPtr dp_group_;
  Composition composition_;
  bool deterministic_ = false;
  bool finished_ = false;                   // finish_gradients() ran since the last step
  std::shared_ptr<mesh::DeviceMesh> mesh_;  // hsdp's or [dp, tp]
  std::vector<std::unique_ptr<ParallelStrategy>> strategies_;
};

// Validates `config`, then applies it to `module` over `world` (collective). `make` builds the optimizer over
// the tensors it is given: the module's parameters (dp) or this rank's shards (ZeRO). step() first finishes
// the tensor-parallel gradients (sequence parallel), then steps.
std::unique_ptr<Parallelized> parallelize(torch::nn::Module& module, comm::BackendPtr world,
                                          const ParallelConfig& config, const OptimizerFactory& make);

}  // namespace dtrain::parallel
