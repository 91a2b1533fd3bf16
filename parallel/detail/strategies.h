// The strategies parallelize() composes (parallel_strategy.h), each over the class that does the work:
// tensor parallel's styles, activation checkpointing, ZeRO, data parallel, and, when the data-parallel axis
// has one rank, a plain optimizer over the module's parameters. Private to parallel/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/data_parallel.h"
#include "parallel/parallel_strategy.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"

namespace dtrain::parallel::detail {

class TensorParallelStrategy : public ParallelStrategy {
 public:
  TensorParallelStrategy(torch::nn::Module& module, comm::BackendPtr group, const TensorParallelPlan& plan)
      : tp(module, std::move(group), plan) {}
  std::string name() const override { return "tensor parallel"; }
  void finish_gradients() override { tp.finish_gradients(); }
  std::vector<StepCollective> step_collectives() const override { return tp.step_collectives(); }
  std::string placement_of(const std::string& param) const override;
  TensorParallel tp;
};

// Switches activation checkpointing on for the modules `patterns` name
// (ParallelConfig::activation_checkpointing; parallel/activation_checkpointing.h).
class ActivationCheckpointingStrategy : public ParallelStrategy {
 public:
  ActivationCheckpointingStrategy(torch::nn::Module& module, const std::vector<std::string>& patterns);
  std::string name() const override { return "activation checkpointing"; }
};

// Owns the optimizer over the module's parameters (data parallel, or one data-parallel rank).
class ModuleOptimizerStrategy : public ParallelStrategy {
 public:
  // (`make` is called by build(), once the module's values are final: a subclass's set-up may broadcast them)
  ModuleOptimizerStrategy(torch::nn::Module& module, const OptimizerFactory& make,
                          int64_t data_parallel_ranks)
      : ndp_(data_parallel_ranks) {
    build(module, make);
  }
  std::string name() const override { return "optimizer over the parameters"; }
  std::string placement_of(const std::string& param) const override;
  std::optional<ModelStateMemory> memory(const torch::optim::Optimizer& o) const override;
  torch::optim::Optimizer* optimizer() override { return optimizer_.get(); }
  std::vector<at::Tensor> given_tensors() const override { return given_; }
  std::vector<std::vector<StateSegment>> state_layout() const override;
  std::vector<GradPart> gradient_parts(const Composition& c) const override;

 protected:
  explicit ModuleOptimizerStrategy(int64_t data_parallel_ranks) : ndp_(data_parallel_ranks) {}
  void build(torch::nn::Module& module, const OptimizerFactory& make);
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<at::Tensor> given_;
  std::vector<std::string> given_names_;
  int64_t ndp_;
};

class DataParallelStrategy : public ModuleOptimizerStrategy {
 public:
  DataParallelStrategy(torch::nn::Module& module, comm::BackendPtr group, const DataParallelOptions& opts,
                       const OptimizerFactory& make);
  std::string name() const override { return "data parallel"; }
  void set_requires_gradient_sync(bool sync) override { dp.set_requires_gradient_sync(sync); }
  size_t bucket_count() const override { return dp.buckets().size(); }
  std::vector<StepCollective> step_collectives() const override { return dp.step_collectives(); }
  std::optional<ModelStateMemory> memory(const torch::optim::Optimizer& o) const override {
    return dp.memory(&o);
  }
  DataParallel dp;
};

class ZeroStrategy : public ParallelStrategy {
 public:
  ZeroStrategy(torch::nn::Module& module, comm::BackendPtr group, int stage, const OptimizerFactory& make,
               const ZeroOptions& opts, comm::BackendPtr replicate, int64_t shard_size,
               int64_t data_parallel_ranks);
  std::string name() const override { return str_cat("zero", zero.stage()); }
  void set_requires_gradient_sync(bool sync) override { zero.set_requires_gradient_sync(sync); }
  void after_optimizer() override { zero.shards_changed(); }
  std::string placement_of(const std::string& param) const override;
  size_t bucket_count() const override { return zero.buckets().size(); }
  std::vector<StepCollective> step_collectives() const override { return zero.step_collectives(); }
  std::optional<ModelStateMemory> memory(const torch::optim::Optimizer&) const override {
    return zero.memory();
  }
  torch::optim::Optimizer* optimizer() override { return &zero.optimizer(); }
  std::vector<at::Tensor> given_tensors() const override { return zero.shards(); }
  std::vector<std::vector<StateSegment>> state_layout() const override;
  std::vector<GradPart> gradient_parts(const Composition& c) const override;
  void given_tensors_changed() override { zero.shards_changed(); }
  Zero zero;

 private:
  int64_t shard_size_, ndp_;
};

}  // namespace dtrain::parallel::detail
