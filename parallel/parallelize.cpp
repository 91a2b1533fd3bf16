// parallelize(); see parallelize.h.
#include "parallel/parallelize.h"

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/checkpoint.h"

namespace dtrain::parallel {

Strategy validate_parallel_config(const ParallelConfig& c, int64_t world_size) {
  const Strategy s = parse_strategy(c.strategy);
  if (c.tp < 1 || world_size % c.tp != 0) {
    throw ValueError(str_cat("parallelize: tp ", c.tp, " does not divide the world size ", world_size,
                             ". Use a divisor of ", world_size, "."));
  }
  if (c.shard_size != 0 && s != Strategy::kHybridShard) {
    throw ValueError(str_cat("parallelize: shard_size ", c.shard_size, " is for hsdp only, not ",
                             to_string(s), ". Leave it unset, or use strategy hsdp."));
  }
  if (s == Strategy::kHybridShard &&
      (c.shard_size < 1 || (world_size / c.tp) % c.shard_size != 0 || c.shard_size == world_size / c.tp)) {
    throw ValueError(str_cat("parallelize: hsdp needs shard_size dividing the ", world_size / c.tp,
                             " data-parallel ranks into several groups (got ", c.shard_size,
                             "). Use e.g. shard_size ", std::max<int64_t>(1, world_size / c.tp / 2), "."));
  }
  if (c.tp > 1 && c.tp_plan.styles.empty()) {
    throw ValueError(str_cat("parallelize: tp ", c.tp,
                             " needs a plan (ParallelConfig::tp_plan): which modules take which style."));
  }
  if (c.tp > 1 && s == Strategy::kHybridShard) {
    throw NotSupportedError(
        str_cat("parallelize: hsdp with tp ", c.tp,
                " is not built (2-d is one data-parallel axis × tp). Use zero3 with tp."));
  }
  if (c.buckets.deterministic) {
    const int64_t ndp = world_size / std::max<int64_t>(c.tp, 1);
    if (c.tp > 1 || s == Strategy::kHybridShard || (ndp & (ndp - 1)) != 0) {
      throw NotSupportedError(str_cat(
          "parallelize: deterministic mode is built for dp and zero1-3 over a power-of-2 number of ranks "
          "(got ",
          to_string(s), ", tp ", c.tp, ", ", world_size,
          " ranks): it sums the gradients of fixed micro-batches as one balanced tree, which needs the ranks "
          "to split the tree evenly and no tensor-parallel partial sums. Use dp or zero1-3 on 1, 2, 4, ... "
          "ranks with tp 1, or turn it off."));
    }
  }
  if (c.tp > 1 && c.tp_plan.sequence_parallel && s != Strategy::kDataParallel) {
    throw NotSupportedError(
        str_cat("parallelize: sequence parallel with ", to_string(s),
                " is not built: its whole parameters' gradients are summed over the tp "
                "group after backward, where only dp keeps whole gradients. Use strategy dp, "
                "or turn sequence parallel off."));
  }
  return s;
}

namespace {

// ParallelConfig::checkpoint: every pattern must name at least one module, and each one it names must be
// models::Checkpointable. Checked before anything is switched.
void apply_checkpointing(torch::nn::Module& module, const std::vector<std::string>& patterns) {
  std::vector<models::Checkpointable*> chosen;
  for (const auto& pattern : patterns) {
    int matched = 0;
    std::string names;
    for (const auto& item : module.named_modules("", /*include_self=*/false)) {
      names += str_cat(names.empty() ? "" : ", ", item.key());
      if (!tp_pattern_matches(pattern, item.key())) continue;
      ++matched;
      auto* c = dynamic_cast<models::Checkpointable*>(item.value().get());
      if (c == nullptr) {
        throw ValueError(str_cat("parallelize: checkpoint pattern '", pattern, "' names module '", item.key(),
                                 "', which cannot recompute its activations: it must derive "
                                 "models::Checkpointable and call models::checkpoint in its forward."));
      }
      chosen.push_back(c);
    }
    if (matched == 0) {
      throw ValueError(str_cat("parallelize: checkpoint pattern '", pattern,
                               "' names no module. The module's submodules: ", names, "."));
    }
  }
  for (auto* c : chosen) c->set_checkpointing(true);
}

}  // namespace

Parallelized::Parallelized(torch::nn::Module& module, comm::BackendPtr world, const ParallelConfig& config,
                           const OptimizerFactory& make)
    : strategy_(validate_parallel_config(config, world->group_size())),
      world_(world),
      tp_size_(config.tp),
      shard_size_(config.shard_size),
      deterministic_(config.buckets.deterministic) {
  // The fixed order: tensor parallel, activation checkpointing, ZeRO, data parallel.
  if (config.tp > 1) {
    const int64_t n = world->group_size();
    mesh_ = std::make_shared<mesh::DeviceMesh>(world, std::vector<int64_t>{n / config.tp, config.tp},
                                               std::vector<std::string>{"dp", "tp"});
    tp_ = std::make_unique<TensorParallel>(module, mesh_->axis_group("tp"), config.tp_plan);
    world = mesh_->axis_group("dp");  // the strategy below runs over the data-parallel axis
  }
  apply_checkpointing(module, config.checkpoint);
  if (strategy_ == Strategy::kHybridShard) {
    // ranks laid out [replicas, shard_size]: a shard group is shard_size consecutive ranks (one host, as a
    // rule), a replica group the ranks at the same place in each
    const int64_t n = world->group_size();
    mesh_ = std::make_shared<mesh::DeviceMesh>(world,
                                               std::vector<int64_t>{n / config.shard_size, config.shard_size},
                                               std::vector<std::string>{"replicate", "shard"});
    zero_ = std::make_unique<Zero>(module, mesh_->axis_group("shard"), 3, make, config.buckets,
                                   mesh_->axis_group("replicate"));
    return;
  }
  if (strategy_ == Strategy::kZero1 || strategy_ == Strategy::kZero2 || strategy_ == Strategy::kZero3) {
    const int stage = strategy_ == Strategy::kZero1 ? 1 : strategy_ == Strategy::kZero2 ? 2 : 3;
    zero_ = std::make_unique<Zero>(module, std::move(world), stage, make, config.buckets);
    return;
  }
  // (tensor parallel alone, one data-parallel rank: nothing to reduce)
  if (!(tp_ && world->group_size() == 1)) {
    dp_ = std::make_unique<DataParallel>(module, std::move(world), config.buckets);
  }
  for (const auto& item : module.named_parameters()) {
    given_.push_back(item.value());
    given_names_.push_back(item.key());
  }
  optimizer_ = make(given_);
  if (!optimizer_) throw ValueError("parallelize: the optimizer factory returned no optimizer.");
}

void Parallelized::zero_grad() {
  zero_ ? zero_->zero_grad() : optimizer_->zero_grad();
  finished_ = false;
}

void Parallelized::finish_gradients() {
  if (tp_ && !finished_) tp_->finish_gradients();
  finished_ = true;
}

void Parallelized::step(const std::function<void()>& after_optimizer) {
  finish_gradients();
  finished_ = false;
  if (zero_) {
    zero_->step(after_optimizer);
  } else {
    optimizer_->step();
    if (after_optimizer) after_optimizer();
  }
}

void Parallelized::set_requires_gradient_sync(bool sync) {
  if (zero_) zero_->set_requires_gradient_sync(sync);
  if (dp_) dp_->set_requires_gradient_sync(sync);
}

ModelStateMemory Parallelized::memory() const {
  if (zero_) return zero_->memory();
  if (dp_) return dp_->memory(optimizer_.get());
  ModelStateMemory m;  // tensor parallel alone: this rank's parts, their gradients and optimizer state
  for (const auto& group : optimizer_->param_groups()) {
    for (const auto& p : group.params()) {
      m.parameters += p.numel() * p.element_size();
      if (p.grad().defined()) m.gradients += p.grad().numel() * p.grad().element_size();
    }
  }
  m.optimizer_state = optimizer_state_bytes(*optimizer_);
  return m;
}

torch::optim::Optimizer& Parallelized::optimizer() { return zero_ ? zero_->optimizer() : *optimizer_; }

std::vector<Parallelized::GradPart> Parallelized::gradient_parts() const {
  const int64_t n = world_->group_size(), ndp = n / tp_size_;
  std::vector<GradPart> out;
  if (zero_) {
    const int64_t copies = shard_size_ > 0 ? n / shard_size_ : 1;  // hsdp: the replicas hold the same shards
    std::vector<at::Tensor> shards;
    for (const auto& g : zero_->optimizer().param_groups()) {
      for (const auto& p : g.params()) shards.push_back(p);
    }
    if (!tp_) {
      for (const auto& p : shards) out.push_back(GradPart{p.grad(), copies});
      return out;
    }
    // with tp, a shard holds tensor-parallel parts (one per tp group) and whole parameters (the same on
    // every rank of the group): run by run
    for (const auto& seg : zero_->shard_segments()) {
      const at::Tensor g = shards.at(seg.bucket).grad();
      if (!g.defined()) continue;
      const bool part = tp_->part_of(seg.param).count >= 0;
      out.push_back(GradPart{g.narrow(0, seg.offset, seg.count), part ? copies : copies * tp_size_});
    }
    return out;
  }
  size_t i = 0;  // (the optimizer's tensors follow given_: the parameters, or their fp32 masters)
  for (const auto& g : optimizer_->param_groups()) {
    for (const auto& p : g.params()) {
      // data parallel: every data-parallel rank holds the same gradient; a parameter tensor parallelism left
      // whole is also the same on every rank of its tp group
      const bool part = tp_ && i < given_.size() && tp_->is_sharded(given_[i]);
      ++i;
      out.push_back(GradPart{p.grad(), part || !tp_ ? ndp : ndp * tp_size_});
    }
  }
  return out;
}

std::vector<at::Tensor> Parallelized::given_tensors() const { return zero_ ? zero_->shards() : given_; }

std::vector<std::vector<Parallelized::StateSegment>> Parallelized::state_layout() const {
  std::vector<std::vector<StateSegment>> out;
  if (zero_) {
    out.resize(zero_->shards().size());
    for (const auto& seg : zero_->shard_segments()) {
      out.at(seg.bucket)
          .push_back(StateSegment{seg.param, seg.sizes, seg.param_offset, seg.offset, seg.count});
    }
    return out;
  }
  for (size_t i = 0; i < given_.size(); ++i) {
    const auto sizes = given_[i].sizes().vec();
    out.push_back({StateSegment{given_names_[i], sizes, 0, 0, given_[i].numel()}});
  }
  return out;
}

void Parallelized::given_tensors_changed() {
  if (zero_) zero_->shards_changed();
}

std::string Parallelized::placement_of(const std::string& param) const {
  std::string tp;
  if (tp_) {
    const auto part = tp_->part_of(param);
    tp = part.count >= 0 ? str_cat("Shard(", part.dim, ") over tp ", tp_size_)
                         : str_cat("Replicate over tp ", tp_size_);
  }
  const int64_t ndp = world_->group_size() / tp_size_;
  std::string dp;
  if (zero_) {
    dp = shard_size_ > 0 ? str_cat("flat shards of buckets over ", shard_size_, " ranks, replicated ",
                                   ndp / shard_size_, " times")
                         : str_cat("flat shards of buckets over dp ", ndp, " (", to_string(strategy_), ")");
  } else {
    dp = str_cat("Replicate over dp ", ndp);
  }
  return tp.empty() ? dp : str_cat(tp, ", ", dp);
}

at::Tensor Parallelized::gradient_block_squares() const {
  DTRAIN_ASSERT(zero_ != nullptr, "gradient_block_squares is for ZeRO");
  return zero_->gradient_block_squares();
}

size_t Parallelized::bucket_count() const {
  return zero_ ? zero_->buckets().size() : dp_ ? dp_->buckets().size() : 0;
}

std::unique_ptr<Parallelized> parallelize(torch::nn::Module& module, comm::BackendPtr world,
                                          const ParallelConfig& config, const OptimizerFactory& make) {
  return std::make_unique<Parallelized>(module, std::move(world), config, make);
}

}  // namespace dtrain::parallel
