// parallelize(); see parallelize.h.
#include "parallel/parallelize.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "parallel/detail/strategies.h"

namespace dtrain::parallel {

std::vector<std::string> validate_mesh_order(const ParallelConfig& c) {
  const Strategy s = parse_strategy(c.strategy);
  const std::vector<std::string> axes = c.tp > 1 ? std::vector<std::string>{"dp", "tp"}
                                        : s == Strategy::kHybridShard
                                            ? std::vector<std::string>{"replicate", "shard"}
                                            : std::vector<std::string>{};
  if (c.mesh_order.empty()) return axes;
  std::vector<std::string> a = axes, b = c.mesh_order;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) {
    std::string given, want;
    for (const auto& x : c.mesh_order) given += (given.empty() ? "" : ",") + x;
    for (const auto& x : axes) want += (want.empty() ? "" : ",") + x;
    throw ValueError(
        str_cat("parallelize: mesh order \"", given, "\" does not name this layout's mesh axes (",
                to_string(s), ", tp ", c.tp, "): ",
                axes.empty()
                    ? "it has no mesh (a mesh comes with tp > 1 or hsdp). Leave the order unset."
                    : str_cat("use a permutation of \"", want, "\", outermost first, e.g. \"", want, "\".")));
  }
  return c.mesh_order;
}

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
  validate_mesh_order(c);
  if (c.materialize && s != Strategy::kZero3 && s != Strategy::kHybridShard) {
    throw ValueError(
        str_cat("parallelize: materialize (values for a module built on the meta device) is for "
                "zero3 and hsdp, which never hold the module whole; got ",
                to_string(s), ". Build the module on the CPU, or use zero3."));
  }
  if (c.reduction.deterministic) {
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

Parallelized::Parallelized(torch::nn::Module& module, comm::BackendPtr world, const ParallelConfig& config,
                           const OptimizerFactory& make)
    : strategy_(validate_parallel_config(config, world->group_size())),
      world_(world),
      deterministic_(config.reduction.deterministic) {
  composition_.tp_size = config.tp;
  composition_.world_size = world->group_size();
  // The fixed order: tensor parallel, activation checkpointing, ZeRO or data parallel.
  const std::vector<std::string> order = validate_mesh_order(config);
  // The mesh over `group`, its axes in `order`: {outer, inner} of sizes by name.
  auto make_mesh = [&order](const comm::BackendPtr& group, const std::map<std::string, int64_t>& sizes) {
    return std::make_shared<mesh::DeviceMesh>(
        group, std::vector<int64_t>{sizes.at(order[0]), sizes.at(order[1])}, order);
  };
  if (config.tp > 1) {
    const int64_t n = world->group_size();
    mesh_ = make_mesh(world, {{"dp", n / config.tp}, {"tp", config.tp}});
    auto tp =
        std::make_unique<detail::TensorParallelStrategy>(module, mesh_->axis_group("tp"), config.tp_plan);
    composition_.tp = &tp->tp;
    strategies_.push_back(std::move(tp));
    world = mesh_->axis_group("dp");  // the strategy below runs over the data-parallel axis
  }
  if (!config.activation_checkpointing.empty()) {
    strategies_.push_back(
        std::make_unique<detail::ActivationCheckpointingStrategy>(module, config.activation_checkpointing));
  }
  dp_group_ = world;
  const int64_t ndp = world->group_size();
  ZeroOptions zero_options(config.reduction);
  zero_options.materialize = config.materialize;
  switch (strategy_) {
    case Strategy::kHybridShard: {
      // ranks laid out [replicas, shard_size] by default: a shard group is shard_size consecutive ranks (one
      // host, as a rule), a replica group the ranks at the same place in each
      mesh_ = make_mesh(world, {{"replicate", ndp / config.shard_size}, {"shard", config.shard_size}});
      strategies_.push_back(
          std::make_unique<detail::ZeroStrategy>(module, mesh_->axis_group("shard"), 3, make, zero_options,
                                                 mesh_->axis_group("replicate"), config.shard_size, ndp));
      break;
    }
    case Strategy::kZero1:
    case Strategy::kZero2:
    case Strategy::kZero3: {
      const int stage = strategy_ == Strategy::kZero1 ? 1 : strategy_ == Strategy::kZero2 ? 2 : 3;
      strategies_.push_back(std::make_unique<detail::ZeroStrategy>(module, std::move(world), stage, make,
                                                                   zero_options, nullptr, 0, ndp));
      break;
    }
    case Strategy::kDataParallel:
      // (tensor parallel alone, one data-parallel rank: nothing to reduce)
      if (ndp == 1 && config.tp > 1) {
        strategies_.push_back(std::make_unique<detail::ModuleOptimizerStrategy>(module, make, ndp));
      } else {
        strategies_.push_back(
            std::make_unique<detail::DataParallelStrategy>(module, std::move(world), config.reduction, make));
      }
      break;
  }
}

Parallelized::~Parallelized() = default;

void Parallelized::zero_grad() {
  owner().optimizer()->zero_grad();
  for (auto& s : strategies_) s->zero_grad();
  finished_ = false;
}

void Parallelized::finish_gradients() {
  if (!finished_) {
    for (auto& s : strategies_) s->finish_gradients();
  }
  finished_ = true;
}

void Parallelized::step(const std::function<void()>& after_optimizer) {
  finish_gradients();
  finished_ = false;
  owner().optimizer()->step();
  if (after_optimizer) after_optimizer();
  for (auto& s : strategies_) s->after_optimizer();
}

void Parallelized::set_requires_gradient_sync(bool sync) {
  for (auto& s : strategies_) s->set_requires_gradient_sync(sync);
}

ModelStateMemory Parallelized::memory() const {
  for (auto it = strategies_.rbegin(); it != strategies_.rend(); ++it) {
    if (auto m = (*it)->memory(*owner().optimizer())) return *m;
  }
  DTRAIN_ASSERT(false, "no strategy reports the model-state memory");
  return {};
}

torch::optim::Optimizer& Parallelized::optimizer() { return *owner().optimizer(); }

DataParallel* Parallelized::data_parallel() {
  for (auto& s : strategies_) {
    if (auto* d = dynamic_cast<detail::DataParallelStrategy*>(s.get())) return &d->dp;
  }
  return nullptr;
}

TensorParallel* Parallelized::tensor_parallel() {
  for (auto& s : strategies_) {
    if (auto* t = dynamic_cast<detail::TensorParallelStrategy*>(s.get())) return &t->tp;
  }
  return nullptr;
}

std::vector<Parallelized::GradPart> Parallelized::gradient_parts() const {
  return owner().gradient_parts(composition_);
}

at::Tensor Parallelized::gradient_block_squares() const {
  const auto* z = dynamic_cast<const detail::ZeroStrategy*>(&owner());
  DTRAIN_ASSERT(z != nullptr, "gradient_block_squares is for ZeRO");
  return z->zero.gradient_block_squares();
}

std::vector<at::Tensor> Parallelized::given_tensors() const { return owner().given_tensors(); }

std::vector<std::vector<Parallelized::StateSegment>> Parallelized::state_layout() const {
  return owner().state_layout();
}

void Parallelized::given_tensors_changed() {
  for (auto& s : strategies_) s->given_tensors_changed();
}

std::string Parallelized::placement_of(const std::string& param) const {
  std::string out;
  for (const auto& s : strategies_) {
    const std::string words = s->placement_of(param);
    if (!words.empty()) out += str_cat(out.empty() ? "" : ", ", words);
  }
  return out;
}

size_t Parallelized::bucket_count() const {
  size_t n = 0;
  for (const auto& s : strategies_) n += s->bucket_count();
  return n;
}

std::vector<StepCollective> Parallelized::step_collectives() const {
  std::vector<StepCollective> out;
  for (const auto& s : strategies_) {
    for (auto& c : s->step_collectives()) out.push_back(std::move(c));
  }
  return out;
}

std::unique_ptr<Parallelized> parallelize(torch::nn::Module& module, comm::BackendPtr world,
                                          const ParallelConfig& config, const OptimizerFactory& make) {
  return std::make_unique<Parallelized>(module, std::move(world), config, make);
}

}  // namespace dtrain::parallel
