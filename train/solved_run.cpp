// SolvedRun; see solved_run.h.
#include "train/solved_run.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "plan/optimizer_state.h"
#include "plan/solution_report.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"
#include "tensor/follow_plan.h"
#include "tensor/redistribute.h"
#include "tensor/settings.h"
#include "train/trainer.h"

namespace dtrain::train {

namespace {

plan::NamedTensors named_parameters(torch::nn::Module& m) {
  plan::NamedTensors out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

// "2,2" as {2, 2}; "" as one axis of every rank.
std::vector<int64_t> mesh_shape_of(const std::string& text, int64_t world_size) {
  if (text.empty()) return {world_size};
  std::vector<int64_t> shape;
  std::stringstream ss(text);
  std::string part;
  int64_t product = 1;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1) {
      throw ValueError(str_cat("train: --solve-mesh '", text,
                               "' must be axis sizes separated by commas, each at least 1, e.g. 2,2."));
    }
    shape.push_back(v);
    product *= v;
  }
  if (product != world_size) {
    throw ValueError(str_cat("train: --solve-mesh ", text, " has ", product, " ranks, but the job has ",
                             world_size, ". Give axis sizes whose product is ", world_size, "."));
  }
  return shape;
}

}  // namespace

void check_solve_options(const TrainerOptions& o) {
  auto refuse = [](const std::string& what) {
    throw ValueError(
        str_cat("train: ", what,
                " is a setting of the hand-written layouts; under --strategy solve the solver places "
                "every op itself. Leave it out."));
  };
  if (o.tp != 1) refuse(str_cat("--tp ", o.tp));
  if (o.shard_size != 0) refuse(str_cat("--shard-size ", o.shard_size));
  if (!o.mesh_order.empty()) refuse(str_cat("--mesh-order ", o.mesh_order));
  if (o.bucket_bytes != 0) refuse(str_cat("--bucket-bytes ", o.bucket_bytes));
  if (o.tp_plan.sequence_parallel) refuse("--sequence-parallel");
  if (!o.activation_checkpointing.empty()) {
    throw NotSupportedError(
        "train: activation checkpointing under --strategy solve is not built yet (the recorded step would "
        "have to hold the recomputation). Leave --checkpoint-activations out.");
  }
  if (o.deterministic) {
    throw NotSupportedError(
        "train: --deterministic under --strategy solve is not built yet: the plan's reductions have no fixed "
        "order across world sizes. Use it with dp or zero1-3.");
  }
  if (o.precision != "fp32" || !o.reduce_dtype.empty()) {
    throw NotSupportedError(
        str_cat("train: --precision ", o.precision, o.reduce_dtype.empty() ? "" : " / --reduce-dtype ",
                o.reduce_dtype,
                " under --strategy solve is not built yet: the solver plans fp32 steps. Use "
                "--precision fp32."));
  }
  if (!o.save.empty() || !o.resume.empty() || !o.init_from.empty()) {
    throw NotSupportedError(
        "train: checkpoints (--save, --resume, --init-from) under --strategy solve are not built yet: a "
        "solved layout's shards have no checkpoint format. Train without them, or use dp or zero1-3.");
  }
  if (o.accumulation != 1) {
    throw NotSupportedError(str_cat(
        "train: --accumulation ", o.accumulation,
        " under --strategy solve is not built yet: the step of several micro-batches reads every parameter "
        "in "
        "each, which makes its graph too wide for the solver's exact elimination. Use --accumulation 1 (a "
        "smaller --batch, if the memory needs it)."));
  }
  if (o.batch % o.accumulation != 0) {
    throw ValueError(str_cat("train: --strategy solve needs --batch ", o.batch,
                             " to be a multiple of --accumulation ", o.accumulation,
                             ": the step is recorded with micro-batches of one size."));
  }
  if (o.solve_budget < 0) {
    throw ValueError(str_cat("train: --solve-budget ", o.solve_budget,
                             " must be a memory per rank (e.g. 64M), or 0 for none."));
  }
  if (o.solve_batch_axis < -1) {
    throw ValueError(str_cat("train: --solve-batch-axis ", o.solve_batch_axis,
                             " must be a mesh axis (0, 1, ...) or -1 (the solver's choice)."));
  }
}

std::string solved_input_name(size_t tensor, int64_t micro) {
  return micro == 0 ? str_cat("batch", tensor) : str_cat("batch", tensor, ":", micro);
}

SolvedRun::SolvedRun(torch::nn::Module& model, LossFn loss, const Batch& sample, const TrainerOptions& o,
                     comm::BackendPtr world)
    : model_(model), loss_(std::move(loss)), accumulation_(o.accumulation), clip_(o.clip) {
  const std::vector<int64_t> shape = mesh_shape_of(o.solve_mesh, world->group_size());
  std::vector<std::string> axes;
  for (size_t a = 0; a < shape.size(); ++a) axes.push_back(str_cat("m", a));
  mesh_ = std::make_shared<const mesh::DeviceMesh>(world, shape, axes);
  tensor::distribute_module(model_, mesh_);  // (replicated)
  for (const auto& p : model_.parameters()) params_.push_back(p);
  opt_ = std::make_unique<torch::optim::AdamW>(
      params_,
      torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay).betas({o.beta1, o.beta2}).eps(o.eps));
  plan::init_optimizer_state(*opt_);

  // The record: on the module itself, its state put back afterwards.
  plan::NamedTensors named = named_parameters(model_);
  for (auto& s : plan::optimizer_state(*opt_, named_parameters(model_))) named.push_back(s);
  std::map<int64_t, std::vector<Batch>> record_inputs;
  plan::SolveStepOptions so;
  for (int64_t b : {so.small, 2 * so.small}) {
    Batch rows;  // micro-batches of b rows, the sample's first ones (repeated where it has fewer)
    for (const at::Tensor& t : sample) {
      rows.push_back(t.index_select(0, at::arange(b * accumulation_, at::kLong).remainder(t.size(0))));
    }
    record_inputs[b] = inputs_of(rows, b, false);
    for (int64_t k = 0; k < accumulation_; ++k) {
      for (size_t i = 0; i < sample.size(); ++i)
        named.emplace_back(solved_input_name(i, k), record_inputs[b][k][i]);
    }
  }
  std::vector<at::Tensor> saved;
  for (const auto& p : params_) saved.push_back(tensor::stored_block(p).clone());
  auto gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng = gen.get_state();
  so.mesh_shape = shape;
  so.budget = static_cast<double>(o.solve_budget);
  so.pins = o.solve_pins;
  so.batch_axis = static_cast<int>(o.solve_batch_axis);
  for (int64_t k = 0; k < accumulation_; ++k) {
    for (size_t i = 0; i < sample.size(); ++i) so.batch_inputs.push_back(solved_input_name(i, k));
  }
  const int n_axes = static_cast<int>(shape.size());
  const std::string& profile = tensor::settings().comm_profile;
  const comm::CostModel comm = profile.empty()
                                   ? comm::CostModel::defaults(n_axes)
                                   : comm::CostModel::from_profile(comm::read_profile(profile), n_axes);
  solved_ = plan::solve_step([&](int64_t b) { run(record_inputs.at(b)); }, o.batch / accumulation_, named,
                             comm, so, world.get());
  {
    c10::AutoGradMode no_grad(false);
    for (size_t i = 0; i < params_.size(); ++i) tensor::stored_block(params_[i]).copy_(saved[i]);
  }
  gen.set_state(rng);
  opt_->zero_grad();
  opt_->state().clear();
  plan::init_optimizer_state(*opt_);
  losses_.clear();
  norm_ = at::Tensor();

  plan::NamedTensors values = named_parameters(model_);
  for (auto& s : plan::optimizer_state(*opt_, named_parameters(model_))) values.push_back(s);
  plan::place_values(solved_.plan, values);
  summary_ = describe(comm);
}

SolvedRun::~SolvedRun() = default;

std::vector<SolvedRun::Batch> SolvedRun::inputs_of(const Batch& global, int64_t micro, bool planned) const {
  std::vector<Batch> out;
  for (int64_t k = 0; k < accumulation_; ++k) {
    Batch b;
    for (size_t i = 0; i < global.size(); ++i) {
      const at::Tensor rows = global[i].narrow(0, k * micro, micro).contiguous();
      tensor::Placements p(mesh_->ndim(), tensor::Replicate());
      if (planned) {
        for (const auto& [name, placements] : solved_.plan.values) {
          if (name == solved_input_name(i, k)) p = placements;
        }
      }
      b.push_back(tensor::from_local(tensor::local_block(rows, mesh_->shape(), p, mesh_->coordinate()), mesh_,
                                     p, rows.sizes().vec()));
    }
    out.push_back(std::move(b));
  }
  return out;
}

void SolvedRun::run(const std::vector<Batch>& inputs) {
  opt_->zero_grad();
  losses_.clear();
  for (const Batch& rows : inputs) {
    at::Tensor loss = loss_(rows);
    losses_.push_back(loss.detach());
    (loss * (1.0 / static_cast<double>(accumulation_))).backward();
  }
  if (clip_ > 0) {  // libtorch's clip_grad_norm_, in DTensor ops (so the plan places them too)
    at::Tensor total;
    for (const auto& p : params_) {
      if (!p.grad().defined()) continue;
      at::Tensor s = p.grad().pow(2).sum();
      total = total.defined() ? total + s : s;
    }
    if (total.defined()) {
      norm_ = total.sqrt();
      const at::Tensor coef = (norm_ + 1e-6).reciprocal().mul(clip_).clamp_max(1.0);
      for (const auto& p : params_) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  opt_->step();
}

double SolvedRun::step(const Batch& global, double lr, double* grad_norm) {
  for (auto& g : opt_->param_groups()) g.options().set_lr(lr);
  const int64_t micro = global[0].size(0) / accumulation_;
  const std::vector<Batch> inputs = inputs_of(global, micro, true);
  {
    tensor::FollowPlan follow(solved_.plan.ops);
    run(inputs);
    follow.end_step();
  }
  double loss = 0;
  for (const auto& l : losses_) loss += tensor::full_tensor(l).item<double>();
  loss /= static_cast<double>(accumulation_);
  if (grad_norm != nullptr) *grad_norm = norm_.defined() ? tensor::full_tensor(norm_).item<double>() : -1.0;
  losses_.clear();
  norm_ = at::Tensor();
  return loss;
}

std::string SolvedRun::describe(const comm::CostModel& comm) const {
  const plan::SolvedStep& s = solved_;
  std::string mesh;
  for (int64_t m : mesh_->shape()) mesh += str_cat(mesh.empty() ? "" : "x", m);
  int collectives = 0, redistributions = 0;
  double bytes = 0;
  for (const auto& r : plan::redistributions(s.record, s.graph, s.solution.choice, comm)) {
    ++redistributions;
    collectives += r.collectives;
    bytes += r.bytes;
  }
  char text[512];
  std::snprintf(
      text, sizeof(text),
      "dtrain train: strategy solve on a %s mesh: %zu ops a step recorded in %.2f s, graph of %zu nodes "
      "in %.2f s, solved in %.2f s (gap %.3g%s); predicted step %.1f ms, %d redistributions (%d "
      "collectives, %.2f MiB per rank), memory at the peak %.2f MiB per rank (replicated: %.2f "
      "MiB)\n",
      mesh.c_str(), s.record.ops.size(), s.record_s, s.graph.problem.nodes.size(), s.graph_s, s.solve_s,
      s.solution.gap, s.solution.gap == 0 ? ", optimal" : "", s.solution.time_s * 1000, redistributions,
      collectives, bytes / (1 << 20), s.solution.memory / (1 << 20), s.graph.replicated_bytes / (1 << 20));
  return text;
}

}  // namespace dtrain::train
