// DeepSpeed ZeRO stages 1, 2 and 3; see zero.h. The stages are ZeRO's reduction of the shared gradient
// buckets (detail/zero_state.h): here the reduce-scatter, where each stage's reduced shard lands, hsdp's
// replica all-reduce, and the Zero class over them; the shards are in zero_shards.cpp, stage 3's units in
// zero3_units.cpp.
#include "parallel/zero.h"

#include <ATen/ATen.h>

#include <chrono>
#include <mutex>

#include "comm/comm_log.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/detail/zero_state.h"

namespace dtrain::parallel {

namespace detail {

comm::WorkPtr ZeroState::launch(size_t k, comm::AgreementRun run) {
  GradBuckets::Bucket& b = engine.buckets[k];
  Shard& z = shards[k];
  if (!z.shard_grad.defined())
    z.shard_grad = at::zeros({z.counts[engine.group->group_rank()]}, b.flat.options());
  // The bucket's values are not needed once reduced (stage 1 copies its reduced chunk back into it in
  // land()), so the engine may reduce in it: Gloo then needs no copy of the bucket.
  comm::ReduceScatterOptions o{comm::ReduceOp::kSum, {}, run};
  o.input_is_scratch = true;
  return engine.group->reduce_scatter_v(z.shard_grad, b.flat, z.counts, o);
}

void ZeroState::reduced(size_t k) {
  if (engine.replicas() == 1) return;
  // hsdp: the shard summed over the shard groups
  Shard& z = shards[k];
  comm::CommCause cause("hsdp");
  z.replica = engine.replicate->all_reduce(
      z.shard_grad, {comm::ReduceOp::kSum, {}, {engine.fingerprint ^ 0x5bd1e995ull, k == 0}});
}

void ZeroState::land() {
  if (engine.replicas() > 1) {
    for (auto& z : shards) {
      z.replica->wait();
      z.replica.reset();
    }
  }
  // The reduced shard is the optimizer's gradient. Stage 1 keeps it in its place in the full bucket (the
  // reduce-scatter's output buffer goes), stages 2 and 3 keep only it (the full bucket went once reduced).
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < shards.size(); ++k) {
    Shard& z = shards[k];
    if (stage == 1) {
      at::Tensor own = alias(engine.buckets[k].flat, z.start, {z.shard_grad.numel()});
      own.copy_(z.shard_grad);
      z.shard_param.mutable_grad() = own;
      z.shard_grad = at::Tensor();
    } else {
      z.shard_param.mutable_grad() = z.shard_grad;
    }
  }
}

void ZeroState::det_land(size_t k, const at::Tensor& part, const std::vector<int64_t>& counts) {
  Shard& z = shards[k];
  const int64_t me = engine.group->group_rank();
  if (stage == 1) {  // the reduced shard in its place in the full bucket, as land()
    at::Tensor own = alias(engine.buckets[k].flat, z.start, {counts[me]});
    own.copy_(part);
    z.shard_param.mutable_grad() = own;
  } else {
    z.shard_grad = alias(part, 0, {counts[me]});  // (not a view: optimizers detach_() their gradients)
    z.shard_param.mutable_grad() = z.shard_grad;
    engine.buckets[k].flat = at::Tensor();
  }
}

void ZeroState::after_pass() {
  if (stage == 3) release_units();
}

}  // namespace detail

namespace {

int checked_stage(int stage) {
  if (stage < 1 || stage > 3) {
    throw ValueError(str_cat("zero: stage ", stage,
                             " does not exist. Use stage 1 (optimizer state sharded), 2 (and gradients) or 3 "
                             "(and parameters)."));
  }
  return stage;
}

}  // namespace

Zero::Zero(torch::nn::Module& module, comm::BackendPtr group, int stage, const OptimizerFactory& make,
           ZeroOptions opts, comm::BackendPtr replicate)
    : stage_(checked_stage(stage)), state_(std::make_shared<detail::ZeroState>()) {
  if (replicate && stage != 3) {
    throw NotSupportedError("zero: replica groups (hsdp) are for ZeRO-3 only.");
  }
  if (opts.side_values != 0) {
    throw NotSupportedError(
        "zero: side_values (reduce_with_gradients) is for data parallel only: ZeRO reduces "
        "each value to one rank. All-reduce such values yourself.");
  }
  opts.rebuild_buckets = false;  // the shards and the optimizer over them are laid out once
  detail::ZeroState& s = *state_;
  detail::GradBuckets& e = s.engine;
  s.stage = stage;
  e.group = std::move(group);
  if (replicate && replicate->group_size() > 1) e.replicate = std::move(replicate);
  e.opts = opts;
  e.materialize = std::move(opts.materialize);
  e.check_options("zero");
  e.reduction = &s;
  e.collect(module, /*meta_allowed=*/stage == 3, "zero");
  if (stage == 3) {
    s.layout_units(module);
  } else {
    e.layout_reversed();
  }
  s.cut_buckets();
  if (stage == 3) {
    s.shard_parameters_only(detail::ZeroState::make_source(state_));
  } else {
    s.shard_buckets();
  }
  e.install_hooks();
  optimizer_ = make(shards());
  if (!optimizer_) throw ValueError("zero: the optimizer factory returned no optimizer.");
}

Zero::~Zero() {
  state_->engine.remove_hooks();
  // Stage 3: the parameters (on demand) keep the shards and units alive through their source; letting go of
  // them here breaks the cycle.
  if (stage_ == 3) {
    for (auto& p : state_->engine.params) p.tensor = at::Tensor();
  }
}

void Zero::zero_grad() { optimizer_->zero_grad(); }

void Zero::step(const std::function<void()>& after_optimizer) {
  optimizer_->step();
  if (after_optimizer) after_optimizer();
  state_->gather_params();
}

void Zero::set_requires_gradient_sync(bool sync) {
  std::lock_guard<std::mutex> lock(state_->engine.mu);
  state_->engine.sync = sync;
}

ModelStateMemory Zero::memory() const {
  const detail::GradBuckets& e = state_->engine;
  std::lock_guard<std::mutex> lock(e.mu);
  ModelStateMemory m = e.common_memory(/*count_parameters=*/stage_ < 3);
  for (size_t k = 0; k < e.buckets.size(); ++k) {
    const auto& b = e.buckets[k];
    const auto& z = state_->shards[k];
    if (stage_ == 1) {  // the full gradient buckets, this rank's shard reduced in them
      m.gradients += detail::bytes_of(b.flat);
      m.buckets += detail::bytes_of(z.shard_grad);  // the reduce-scatter's output, during a backward
    } else {  // stages 2 and 3: this rank's reduced shard; a full bucket is a buffer while a backward needs
              // it
      m.gradients += detail::bytes_of(z.shard_grad);
      m.buckets += detail::bytes_of(b.flat);
    }
    if (stage_ == 3) {  // this rank's shard; a unit gathered at the moment is a buffer
      m.parameters += detail::bytes_of(z.shard_param);
      m.buckets += detail::bytes_of(z.params_flat);
    }
  }
  m.optimizer_state = optimizer_state_bytes(*optimizer_);
  return m;
}

std::vector<StepCollective> Zero::step_collectives() const {
  const detail::ZeroState& s = *state_;
  const detail::GradBuckets& e = s.engine;
  const int64_t n = e.group->group_size(), me = e.group->group_rank(),
                nb = static_cast<int64_t>(e.buckets.size());
  int64_t whole = 0, part = 0, shard_params = 0;
  for (size_t k = 0; k < e.buckets.size(); ++k) {
    whole += e.bucket_bytes(k);
    part += e.part_bytes(k);
    shard_params += s.shards[k].counts[me] * static_cast<int64_t>(s.shards[k].shard_param.element_size());
  }
  std::vector<StepCollective> out;
  if (!e.opts.deterministic) {
    out.push_back({"zero", "reduce_scatter", nb, whole, n});
  } else if (n > 1) {
    out.push_back({"deterministic", "all_to_all", nb, whole, n});
  }
  if (e.replicas() > 1) out.push_back({"hsdp", "all_reduce", nb, part, e.replicas()});
  if (s.stage < 3) {
    out.push_back({"zero", "all_gather", nb, shard_params, n});
  } else {
    out.push_back({"zero3", "all_gather", 2 * nb, 2 * shard_params, n, /*per_micro_batch=*/true});
  }
  return out;
}

std::vector<std::vector<std::string>> Zero::buckets() const { return state_->engine.bucket_names(); }

std::vector<Zero::ShardSegment> Zero::shard_segments() const {
  const detail::GradBuckets& e = state_->engine;
  std::lock_guard<std::mutex> lock(e.mu);
  std::vector<ShardSegment> out;
  const int64_t me = e.group->group_rank();
  for (size_t k = 0; k < e.buckets.size(); ++k) {
    const auto& b = e.buckets[k];
    const auto& z = state_->shards[k];
    const int64_t lo = z.start, hi = z.start + z.counts[me];
    for (int i : b.params) {
      const auto& p = e.params[i];
      const int64_t numel = c10::multiply_integers(p.sizes);
      const int64_t from = std::max(lo, p.offset), to = std::min(hi, p.offset + numel);
      if (to > from) out.push_back(ShardSegment{k, p.name, from - lo, to - from, from - p.offset, p.sizes});
    }
  }
  return out;
}

PassTimeline Zero::last_pass() const {
  std::lock_guard<std::mutex> lock(state_->engine.mu);
  return state_->engine.timeline;
}

std::vector<std::vector<int64_t>> Zero::shard_counts() const {
  std::lock_guard<std::mutex> lock(state_->engine.mu);
  std::vector<std::vector<int64_t>> out;
  for (const auto& z : state_->shards) out.push_back(z.counts);
  return out;
}

std::vector<at::Tensor> Zero::shards() const {
  std::vector<at::Tensor> out;
  for (const auto& z : state_->shards) out.push_back(z.shard_param);
  return out;
}

void Zero::shards_changed() { state_->gather_params(); }

at::Tensor Zero::gradient_block_squares() const {
  constexpr int64_t kBlock = detail::kDetBlock;
  const auto counts = shard_counts();
  std::vector<at::Tensor> shards;
  for (const auto& g : optimizer_->param_groups()) {
    for (const auto& p : g.params()) shards.push_back(p);
  }
  DTRAIN_ASSERT(shards.size() == counts.size(), "one optimizer tensor per ZeRO bucket");
  const comm::BackendPtr& group = state_->engine.group;
  const int64_t n = group->group_size(), me = group->group_rank();
  auto blocks = [&](int64_t count) { return (count + kBlock - 1) / kBlock; };
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> mine;
  std::vector<int64_t> per_rank(n, 0);
  for (size_t k = 0; k < shards.size(); ++k) {
    for (int64_t r = 0; r < n; ++r) per_rank[r] += blocks(counts[k][r]);
    const at::Tensor g = shards[k].grad();
    const int64_t count = counts[k][me], full = count / kBlock;
    if (count == 0) continue;
    at::Tensor sq = g.defined() ? g.detach().to(at::kDouble).pow(2) : at::zeros({count}, at::kDouble);
    if (full > 0) mine.push_back(sq.narrow(0, 0, full * kBlock).view({full, kBlock}).sum(1));
    if (count > full * kBlock)
      mine.push_back(sq.narrow(0, full * kBlock, count - full * kBlock).sum().view({1}));
  }
  at::Tensor local = mine.empty() ? at::zeros({0}, at::kDouble) : at::cat(mine);
  int64_t total = 0;
  for (int64_t c : per_rank) total += c;
  at::Tensor all = at::empty({total}, at::kDouble);
  {
    comm::CommCause cause("clip_grad_norm");
    group->all_gather_v(all, local, per_rank)->wait();
  }
  // rank-major as gathered; put in bucket-major order (the same at any world size)
  std::vector<at::Tensor> ordered;
  std::vector<int64_t> at_rank(n, 0);
  for (int64_t r = 1; r < n; ++r) at_rank[r] = at_rank[r - 1] + per_rank[r - 1];
  for (size_t k = 0; k < counts.size(); ++k) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t c = blocks(counts[k][r]);
      if (c > 0) ordered.push_back(all.narrow(0, at_rank[r], c));
      at_rank[r] += c;
    }
  }
  return ordered.empty() ? at::zeros({0}, at::kDouble) : at::cat(ordered);
}

}  // namespace dtrain::parallel
