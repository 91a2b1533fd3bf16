// The strategies parallelize() composes; see detail/strategies.h.
#include "parallel/detail/strategies.h"

#include "core/error.h"
#include "parallel/activation_checkpointing.h"

namespace dtrain::parallel::detail {

std::string TensorParallelStrategy::placement_of(const std::string& param) const {
  const auto part = tp.part_of(param);
  const int64_t n = tp.group()->group_size();
  return part.count >= 0 ? str_cat("Shard(", part.dim, ") over tp ", n) : str_cat("Replicate over tp ", n);
}

ActivationCheckpointingStrategy::ActivationCheckpointingStrategy(torch::nn::Module& module,
                                                                 const std::vector<std::string>& patterns) {
  checkpoint_activations(module, patterns);
}

void ModuleOptimizerStrategy::build(torch::nn::Module& module, const OptimizerFactory& make) {
  for (const auto& item : module.named_parameters()) {
    given_.push_back(item.value());
    given_names_.push_back(item.key());
  }
  optimizer_ = make(given_);
  if (!optimizer_) throw ValueError("parallelize: the optimizer factory returned no optimizer.");
}

std::string ModuleOptimizerStrategy::placement_of(const std::string&) const {
  return str_cat("Replicate over dp ", ndp_);
}

std::optional<ModelStateMemory> ModuleOptimizerStrategy::memory(const torch::optim::Optimizer& o) const {
  ModelStateMemory m;  // one data-parallel rank: this rank's parts, their gradients and optimizer state
  for (const auto& group : o.param_groups()) {
    for (const auto& p : group.params()) {
      m.parameters += p.numel() * p.element_size();
      if (p.grad().defined()) m.gradients += p.grad().numel() * p.grad().element_size();
    }
  }
  m.optimizer_state = optimizer_state_bytes(o);
  return m;
}

std::vector<std::vector<StateSegment>> ModuleOptimizerStrategy::state_layout() const {
  std::vector<std::vector<StateSegment>> out;
  for (size_t i = 0; i < given_.size(); ++i) {
    const auto sizes = given_[i].sizes().vec();
    out.push_back({StateSegment{given_names_[i], sizes, 0, 0, given_[i].numel()}});
  }
  return out;
}

std::vector<GradPart> ModuleOptimizerStrategy::gradient_parts(const Composition& c) const {
  std::vector<GradPart> out;
  size_t i = 0;  // (the optimizer's tensors follow given_: the parameters, or their fp32 masters)
  for (const auto& g : optimizer_->param_groups()) {
    for (const auto& p : g.params()) {
      // every data-parallel rank holds the same gradient; a parameter tensor parallelism left whole is also
      // the same on every rank of its tp group
      const bool part = c.tp != nullptr && i < given_.size() && c.tp->is_sharded(given_[i]);
      ++i;
      out.push_back(GradPart{p.grad(), part || c.tp == nullptr ? ndp_ : ndp_ * c.tp_size});
    }
  }
  return out;
}

DataParallelStrategy::DataParallelStrategy(torch::nn::Module& module, comm::BackendPtr group,
                                           const DataParallelOptions& opts, const OptimizerFactory& make)
    : ModuleOptimizerStrategy(group->group_size()), dp(module, group, opts) {
  build(module, make);  // (after dp broadcast group rank 0's values: the optimizer's masters copy them)
}

ZeroStrategy::ZeroStrategy(torch::nn::Module& module, comm::BackendPtr group, int stage,
                           const OptimizerFactory& make, const ZeroOptions& opts, comm::BackendPtr replicate,
                           int64_t shard_size, int64_t data_parallel_ranks)
    : zero(module, std::move(group), stage, make, opts, std::move(replicate)),
      shard_size_(shard_size),
      ndp_(data_parallel_ranks) {}

std::string ZeroStrategy::placement_of(const std::string&) const {
  return shard_size_ > 0 ? str_cat("flat shards of buckets over ", shard_size_, " ranks, replicated ",
                                   ndp_ / shard_size_, " times")
                         : str_cat("flat shards of buckets over dp ", ndp_, " (zero", zero.stage(), ")");
}

std::vector<std::vector<StateSegment>> ZeroStrategy::state_layout() const {
  std::vector<std::vector<StateSegment>> out(zero.shards().size());
  for (const auto& seg : zero.shard_segments()) {
    out.at(seg.bucket).push_back(StateSegment{seg.param, seg.sizes, seg.param_offset, seg.offset, seg.count});
  }
  return out;
}

std::vector<GradPart> ZeroStrategy::gradient_parts(const Composition& c) const {
  const int64_t copies = shard_size_ > 0 ? c.world_size / shard_size_ : 1;  // hsdp: replicas hold the same
  std::vector<at::Tensor> shards;
  for (const auto& g : zero.optimizer().param_groups()) {
    for (const auto& p : g.params()) shards.push_back(p);
  }
  std::vector<GradPart> out;
  if (c.tp == nullptr) {
    for (const auto& p : shards) out.push_back(GradPart{p.grad(), copies});
    return out;
  }
  // with tp, a shard holds tensor-parallel parts (one per tp group) and whole parameters (the same on every
  // rank of the group): run by run
  for (const auto& seg : zero.shard_segments()) {
    const at::Tensor g = shards.at(seg.bucket).grad();
    if (!g.defined()) continue;
    const bool part = c.tp->part_of(seg.param).count >= 0;
    out.push_back(GradPart{g.narrow(0, seg.offset, seg.count), part ? copies : copies * c.tp_size});
  }
  return out;
}

}  // namespace dtrain::parallel::detail
