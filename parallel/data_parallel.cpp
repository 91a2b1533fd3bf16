// Horovod-style data parallel; see data_parallel.h. The buckets, their hooks and the pass are the shared
// gradient buckets (detail/grad_buckets.h); what is data parallel's own is the reduction: each bucket
// all-reduced, and its slices then the parameters' gradients.
#include "parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <mutex>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "parallel/detail/grad_buckets.h"

namespace dtrain::parallel {

using detail::bytes_of;

namespace {

// Data parallel's reduction: each bucket summed over the group (the gradients were divided on the way in);
// the bucket's slices are then the parameters' gradients.
class AllReduceBuckets : public detail::BucketReduction {
 public:
  explicit AllReduceBuckets(detail::GradBuckets& engine) : e_(engine) {}
  const char* cause() const override { return "data_parallel"; }
  bool drops_param_grads() const override { return false; }
  bool frees_buckets() const override { return false; }
  comm::WorkPtr launch(size_t k, comm::AgreementRun run) override {
    return e_.group->all_reduce(e_.buckets[k].flat, {comm::ReduceOp::kSum, {}, run});
  }
  void reduced(size_t) override {}
  void land() override {
    for (auto& p : e_.params) {
      at::Tensor s = e_.slice(p);
      if (!p.tensor.grad().defined() || p.tensor.grad().data_ptr() != s.data_ptr())
        p.tensor.mutable_grad() = s;
    }
  }
  void det_land(size_t k, const at::Tensor& part, const std::vector<int64_t>& counts) override {
    e_.det_gather_parts(k, part, counts);
  }
  void after_pass() override {}

 private:
  detail::GradBuckets& e_;
};

}  // namespace

struct DataParallel::State {
  detail::GradBuckets engine;
  std::unique_ptr<AllReduceBuckets> reduction;
};

DataParallelOptions with_horovod_env(DataParallelOptions base) {
  const EnvMap env = current_env();
  if (auto v = env_get(env, "HOROVOD_FUSION_THRESHOLD"); v && !v->empty()) {
    base.bucket_bytes = parse_bytes("HOROVOD_FUSION_THRESHOLD", *v);
  }
  if (auto v = env_get(env, "HOROVOD_CYCLE_TIME"); v && !v->empty()) {
    throw NotSupportedError(str_cat(
        "data_parallel: HOROVOD_CYCLE_TIME=", *v,
        " is not supported: dtrain has no background cycle; each "
        "bucket is all-reduced the moment its last gradient is ready. Unset it, and size the buckets with "
        "HOROVOD_FUSION_THRESHOLD or --bucket-bytes."));
  }
  return base;
}

std::string ModelStateMemory::to_string() const {
  auto mib = [](int64_t b) { return str_cat(static_cast<double>(b) / (1 << 20), " MiB"); };
  return str_cat("parameters ", mib(parameters), ", gradients ", mib(gradients), ", optimizer state ",
                 mib(optimizer_state), ", buffers ", mib(buffers), ", buckets ", mib(buckets), "; total ",
                 mib(total()));
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto* s = state.get();
    if (auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      total += bytes_of(a->exp_avg()) + bytes_of(a->exp_avg_sq()) + bytes_of(a->max_exp_avg_sq());
    } else if (auto* b = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      total += bytes_of(b->exp_avg()) + bytes_of(b->exp_avg_sq()) + bytes_of(b->max_exp_avg_sq());
    } else if (auto* c = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      total += bytes_of(c->momentum_buffer());
    } else if (auto* d = dynamic_cast<const torch::optim::RMSpropParamState*>(s)) {
      total += bytes_of(d->square_avg()) + bytes_of(d->momentum_buffer()) + bytes_of(d->grad_avg());
    } else if (auto* e = dynamic_cast<const torch::optim::AdagradParamState*>(s)) {
      total += bytes_of(e->sum());
    }
  }
  return total;
}

DataParallel::DataParallel(torch::nn::Module& module, comm::BackendPtr group, DataParallelOptions opts)
    : state_(std::make_shared<State>()) {
  detail::GradBuckets& e = state_->engine;
  if (opts.deterministic) opts.rebuild_buckets = false;  // (the tree's layout stays the same throughout)
  e.group = std::move(group);
  e.opts = opts;
  e.check_options("data_parallel");
  state_->reduction = std::make_unique<AllReduceBuckets>(e);
  e.reduction = state_->reduction.get();
  e.collect(module, /*meta_allowed=*/false, "data_parallel");
  e.layout_reversed();
  e.install_hooks();
}

DataParallel::~DataParallel() { state_->engine.remove_hooks(); }

void DataParallel::reduce_with_gradients(at::Tensor values) {
  detail::GradBuckets& e = state_->engine;
  if (values.dim() != 1 || values.numel() > e.opts.side_values || !values.is_contiguous()) {
    throw ValueError(str_cat(rank_prefix(),
                             " data_parallel: reduce_with_gradients takes a contiguous 1-d tensor of "
                             "at most DataParallelOptions::side_values (",
                             e.opts.side_values, ") elements; got ", values.sizes(),
                             ". Raise side_values when building it."));
  }
  std::lock_guard<std::mutex> lock(e.mu);
  e.side = values;
}

void DataParallel::set_requires_gradient_sync(bool sync) {
  std::lock_guard<std::mutex> lock(state_->engine.mu);
  state_->engine.sync = sync;
}

bool DataParallel::requires_gradient_sync() const {
  std::lock_guard<std::mutex> lock(state_->engine.mu);
  return state_->engine.sync;
}

std::vector<StepCollective> DataParallel::step_collectives() const {
  const detail::GradBuckets& e = state_->engine;
  const int64_t n = e.group->group_size(), nb = static_cast<int64_t>(e.buckets.size());
  int64_t whole = 0, part = 0;
  for (size_t k = 0; k < e.buckets.size(); ++k) {
    whole += e.bucket_bytes(k);
    part += e.part_bytes(k);
  }
  if (!e.opts.deterministic) return {{"data_parallel", "all_reduce", nb, whole, n}};
  if (n == 1) return {};
  return {{"deterministic", "all_to_all", nb, whole, n}, {"deterministic", "all_gather", nb, part, n}};
}

std::vector<std::vector<std::string>> DataParallel::buckets() const { return state_->engine.bucket_names(); }

ModelStateMemory DataParallel::memory(const torch::optim::Optimizer* optimizer) const {
  const detail::GradBuckets& e = state_->engine;
  std::lock_guard<std::mutex> lock(e.mu);
  ModelStateMemory m = e.common_memory(/*count_parameters=*/true);
  for (const auto& b : e.buckets) m.gradients += bytes_of(b.flat);
  if (optimizer) m.optimizer_state = optimizer_state_bytes(*optimizer);
  return m;
}

const comm::BackendPtr& DataParallel::group() const { return state_->engine.group; }

PassTimeline DataParallel::last_pass() const {
  std::lock_guard<std::mutex> lock(state_->engine.mu);
  return state_->engine.timeline;
}

}  // namespace dtrain::parallel
