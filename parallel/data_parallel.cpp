// Horovod-style data parallel; see data_parallel.h.
//
// One backward pass ("pass") with gradient sync on:
//   hook(param)   : the param's accumulated .grad is copied into its bucket slice (nothing to copy when .grad
//                   already is that slice); when a bucket's last param is in, launch_ready() all-reduces
//                   every bucket that is complete, strictly in bucket order (every rank issues the same
//                   sequence).
//   finish_pass() : queued on the autograd engine by the pass's first hook, runs when backward ends: params
//                   that got no gradient are an error (or zeros, allow_unused); the remaining buckets go out;
//                   every bucket's work is waited for; each param's .grad becomes a view of its reduced
//                   slice.
#include "parallel/data_parallel.h"
#include "parallel/detail/data_parallel_impl.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_set>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "tensor/comm_log.h"
#include "tensor/cost_model.h"
#include "tensor/on_demand.h"
#include "tensor/settings.h"

namespace dtrain::parallel {

namespace detail {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string describe(const char* kind, const std::string& name, const at::Tensor& t) {
  std::string shape;
  for (int64_t d : t.sizes()) shape += str_cat(shape.empty() ? "" : ", ", d);
  return str_cat(kind, " '", name, "' ", c10::toString(t.scalar_type()), " [", shape, "]");
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

double predicted_seconds(tensor::StepKind kind, int64_t bytes, int n) {
  if (n <= 1 || bytes == 0) return 0;
  static const tensor::CostModel model = [] {
    const std::string profile = tensor::settings().comm_profile;
    return profile.empty() ? tensor::CostModel::defaults(1)
                           : tensor::CostModel::from_profile(tensor::read_profile(profile), 1);
  }();
  const double k = n, b = static_cast<double>(bytes);
  return model.seconds(kind, 0, kind == tensor::StepKind::kAllReduce ? b * 2 * (k - 1) / k : b * (k - 1) / k);
}

void broadcast_coalesced(const comm::BackendPtr& group, const std::vector<at::Tensor>& tensors) {
  if (group->group_size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, ts] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : ts) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    group->broadcast(flat)->wait();
    int64_t off = 0;
    for (auto& t : ts) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

}  // namespace detail

using namespace detail;

void DataParallel::Impl::sync_buffers() {
  if (replicate) broadcast_coalesced(replicate, buffers);
  broadcast_coalesced(group, buffers);
}

at::Tensor DataParallel::Impl::slice(const Param& p) {
  Bucket& b = buckets[p.bucket];
  if (!b.flat.defined()) b.flat = at::zeros({b.numel}, grad_options(p));  // ZeRO-2/3
  return alias(b.flat, p.offset, p.sizes);
}

at::Tensor DataParallel::Impl::alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor s = at::empty({0}, flat.options());
  s.set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return s;
}

void DataParallel::Impl::layout(const std::vector<int>& order) {
  std::vector<std::vector<int>> groups;
  int64_t cap = opts.first_bucket_bytes, bytes = 0;
  for (int i : order) {
    const Param& p = params[i];
    const int64_t b = bytes_of(p.tensor);
    bool fresh = groups.empty() ||
                 params[groups.back().front()].tensor.scalar_type() != p.tensor.scalar_type() ||
                 bytes + b > cap;
    if (fresh) {
      if (!groups.empty()) cap = opts.bucket_bytes;
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += b;
  }
  layout_groups(groups);
}

void DataParallel::Impl::layout_groups(const std::vector<std::vector<int>>& groups) {
  std::vector<at::Tensor> grads(params.size());
  for (size_t i = 0; i < params.size(); ++i) grads[i] = params[i].tensor.grad();
  std::vector<Bucket> next;
  std::vector<int64_t> elements;
  for (const auto& g : groups) {
    next.emplace_back();
    elements.push_back(0);
    for (int i : g) {
      Param& p = params[i];
      p.bucket = static_cast<int>(next.size()) - 1;
      p.offset = elements.back();
      next.back().params.push_back(i);
      elements.back() += p.tensor.numel();
    }
  }
  if (!next.empty()) elements.back() += opts.side_values;  // the last bucket carries the side values
  std::string shape;
  for (size_t k = 0; k < next.size(); ++k) {
    next[k].numel = elements[k];
    if (zero_stage != 3) {  // ZeRO-3 makes them during each synchronised backward
      next[k].flat = at::zeros({elements[k]}, grad_options(params[next[k].params.front()]));
    }
    shape +=
        str_cat(c10::toString(params[next[k].params.front()].tensor.scalar_type()), ":", elements[k], ";");
  }
  if (opts.reduce_dtype) shape += str_cat("reduced in ", c10::toString(*opts.reduce_dtype));
  fingerprint = fnv1a(shape) | 2;  // never 0 (no run) once shifted by the backend
  check_same_layout(shape);
  buckets = std::move(next);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    at::Tensor s = slice(params[i]);
    s.copy_(grads[i]);
    params[i].tensor.mutable_grad() = s;
  }
}

void DataParallel::Impl::check_same_layout(const std::string& shape) {
  const int n = group->group_size();
  if (n == 1) return;
  at::Tensor mine = at::full({1}, static_cast<int64_t>(fingerprint >> 1), at::kLong);
  at::Tensor all = at::empty({n}, at::kLong);
  group->all_gather(all, mine)->wait();
  std::string differ;
  int count = 0;
  for (int r = 0; r < n; ++r) {
    if (all.data_ptr<int64_t>()[r] == all.data_ptr<int64_t>()[0]) continue;
    differ += str_cat(differ.empty() ? "" : ", ", r);
    ++count;
  }
  if (count == 0) return;
  throw ValueError(str_cat(rank_prefix(), " data_parallel: ", count == 1 ? "rank " : "ranks ", differ,
                           count == 1 ? " lays" : " lay",
                           " out other gradient buckets than rank 0 "
                           "(this rank: ",
                           shape,
                           " as dtype:elements per bucket). Give every rank the same "
                           "DataParallelOptions (bucket_bytes ",
                           opts.bucket_bytes, ", first_bucket_bytes ", opts.first_bucket_bytes,
                           ", side_values ", opts.side_values, " here)."));
}

void DataParallel::Impl::take(int i) {
  const Param& p = params[i];
  at::Tensor g = p.tensor.grad(), s = slice(p);
  at::NoGradGuard no_grad;
  const double scale = 1.0 / static_cast<double>(group->group_size() * replicas());
  if (!g.defined()) {
    s.zero_();
  } else if (g.data_ptr() == s.data_ptr()) {
    if (scale != 1.0) s.mul_(scale);
  } else if (scale == 1.0) {
    s.copy_(g);
  } else {
    at::mul_out(s, g, at::scalar_tensor(scale, g.options()));
  }
  if (zero_stage > 0) params[i].tensor.mutable_grad().reset();
}

void DataParallel::Impl::on_grad_ready(int i) {
  std::lock_guard<std::mutex> lock(mu);
  if (opts.deterministic) {  // every backward is a leaf of the step's tree (det_finish_pass)
    if (!in_pass) {
      in_pass = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { det_finish_pass(); });
    }
    return;
  }
  if (!sync) return;
  if (!in_pass) start_pass();
  if (ready[i]) return;
  take(i);
  ready[i] = 1;
  arrival.push_back(i);
  last_gradient = Clock::now();
  if (--buckets[params[i].bucket].pending == 0) launch_ready();
}

void DataParallel::Impl::start_pass() {
  in_pass = true;
  pass_start = Clock::now();
  ready.assign(params.size(), 0);
  arrival.clear();
  next_launch = 0;
  for (auto& b : buckets) {
    b.pending = static_cast<int>(b.params.size());
    b.work.reset();
    b.reduced = false;
  }
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_pass(); });
}

void DataParallel::Impl::launch_ready() {
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
    Bucket& b = buckets[next_launch++];
    b.launched = Clock::now();
    const bool first = next_launch == 1, last = next_launch == buckets.size();
    if (last && opts.side_values > 0) {
      at::Tensor slots = b.flat.narrow(0, b.flat.numel() - opts.side_values, opts.side_values);
      if (side.defined()) {
        slots.narrow(0, 0, side.numel()).copy_(side);
      } else {
        slots.zero_();
      }
    }
    if (zero_stage > 0) {
      if (!b.shard_grad.defined())
        b.shard_grad = at::zeros({b.counts[group->group_rank()]}, b.flat.options());
      b.work = group->reduce_scatter_v(b.shard_grad, b.flat, b.counts,
                                       {comm::ReduceOp::kSum, {}, {fingerprint, first}});
    } else {
      b.work = group->all_reduce(b.flat, {comm::ReduceOp::kSum, {}, {fingerprint, first}});
    }
  }
  // ZeRO-2/3: a full bucket goes as soon as its reduction is done (checked in bucket order), and at most
  // kMaxInFlight are awaiting theirs (the oldest is waited for), so that backward holds a few at once, not
  // every gradient.
  if (zero_stage >= 2) {
    constexpr size_t kMaxInFlight = 2;
    size_t in_flight = 0;
    for (size_t k = 0; k < next_launch; ++k) in_flight += buckets[k].reduced ? 0 : 1;
    for (size_t k = 0; k < next_launch; ++k) {
      if (buckets[k].reduced) continue;
      if (in_flight <= kMaxInFlight && !buckets[k].work->is_completed()) break;
      complete(buckets[k]);
      --in_flight;
    }
  }
}

void DataParallel::Impl::complete(Bucket& b) {
  if (b.reduced) return;
  {
    tensor::CommCause cause(zero_stage > 0 ? "zero" : "data_parallel");
    b.work->wait();
    const tensor::StepKind kind =
        zero_stage > 0 ? tensor::StepKind::kReduceScatter : tensor::StepKind::kAllReduce;
    tensor::CommLog::instance().record(
        tensor::CommRecord{tensor::CommCause::current(), kind, 0, bytes_of(b.flat),
                           predicted_seconds(kind, bytes_of(b.flat), group->group_size()),
                           std::chrono::duration<double>(Clock::now() - b.launched).count()});
  }
  b.reduced = true;
  b.work.reset();  // it holds the collective's buffers (Gloo's padded copy of the bucket)
  if (zero_stage >= 2) b.flat = at::Tensor();
  if (replicas() > 1) {  // hsdp: the shard summed over the shard groups
    b.launched = Clock::now();
    b.work = replicate->all_reduce(
        b.shard_grad, {comm::ReduceOp::kSum, {}, {fingerprint ^ 0x5bd1e995ull, &b == &buckets.front()}});
  }
}

void DataParallel::Impl::finish_pass() {
  std::lock_guard<std::mutex> lock(mu);
  in_pass = false;
  std::vector<int> unused;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!ready[i]) unused.push_back(static_cast<int>(i));
  }
  if (!unused.empty() && !opts.allow_unused) {
    std::string names;
    for (size_t k = 0; k < unused.size() && k < 8; ++k) {
      names += str_cat(k == 0 ? "" : ", ", params[unused[k]].name);
    }
    if (unused.size() > 8) names += str_cat(", ... (", unused.size(), " of ", params.size(), ")");
    throw ValueError(
        str_cat(rank_prefix(),
                " data_parallel: these parameters received no gradient in this "
                "backward: ",
                names,
                ". They took no part in computing the loss, so the ranks "
                "cannot reduce their gradients. Set DataParallelOptions::allow_unused (DDP's "
                "find_unused_parameters) if that is intended, or leave them out of the module."));
  }
  {
    at::NoGradGuard no_grad;
    for (int i : unused) {
      take(i);  // its .grad if it has one (accumulated earlier), else zeros
      if (--buckets[params[i].bucket].pending == 0) launch_ready();
    }
  }
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - pass_start).count(); };
  timeline = PassTimeline{};
  for (const auto& b : buckets) timeline.bucket_launch_s.push_back(since(b.launched));
  timeline.last_gradient_s = since(last_gradient);
  for (auto& b : buckets) complete(b);
  if (replicas() > 1) {
    for (auto& b : buckets) {
      tensor::CommCause cause("hsdp");
      b.work->wait();
      tensor::CommLog::instance().record(tensor::CommRecord{
          tensor::CommCause::current(), tensor::StepKind::kAllReduce, 0, bytes_of(b.shard_grad),
          predicted_seconds(tensor::StepKind::kAllReduce, bytes_of(b.shard_grad), replicas()),
          std::chrono::duration<double>(Clock::now() - b.launched).count()});
    }
  }
  timeline.end_s = since(Clock::now());
  if (zero_stage > 0) {
    // The reduced shard is the optimizer's gradient. ZeRO-1 keeps it in its place in the full bucket (the
    // reduce-scatter's output buffer goes), ZeRO-2 keeps only it (the full bucket goes).
    at::NoGradGuard no_grad;
    for (auto& b : buckets) {
      if (zero_stage == 1) {
        at::Tensor own = alias(b.flat, b.start, {b.shard_grad.numel()});
        own.copy_(b.shard_grad);
        b.shard_param.mutable_grad() = own;
        b.shard_grad = at::Tensor();
      } else {
        b.shard_param.mutable_grad() = b.shard_grad;
        b.flat = at::Tensor();
      }
    }
    if (zero_stage == 3) release_units();
    ++passes;
    sync_buffers();
    return;
  }
  for (Param& p : params) {
    at::Tensor s = slice(p);
    if (!p.tensor.grad().defined() || p.tensor.grad().data_ptr() != s.data_ptr()) p.tensor.mutable_grad() = s;
  }
  if (side.defined()) {
    const at::Tensor& last = buckets.back().flat;
    side.copy_(last.narrow(0, last.numel() - opts.side_values, side.numel()));
    side = at::Tensor();
  }
  if (++passes == 1 && opts.rebuild_buckets && params.size() > 1) rebuild();
  sync_buffers();
}

void DataParallel::Impl::rebuild() {
  std::vector<int> order = arrival;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    if (!ready[i]) order.push_back(i);
  }
  at::Tensor t = at::tensor(std::vector<int64_t>(order.begin(), order.end()), at::kLong);
  if (group->group_size() > 1) group->broadcast(t)->wait();
  std::vector<int> agreed(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  layout(agreed);
}

namespace {

struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  GradReadyHook(DataParallel::Impl* impl, int index) : impl(impl), index(index) {}
  void operator()(const torch::autograd::Variable&) override { impl->on_grad_ready(index); }
  DataParallel::Impl* impl;
  int index;
};

// Every rank must hold the same module: compares a fingerprint of the names, dtypes and shapes, and on a
// difference finds each differing rank's first differing entry against group rank 0's.
void check_same_module(const comm::BackendPtr& group, const std::vector<std::string>& entries) {
  std::string all;
  for (const auto& e : entries) all += e + "\n";
  const int n = group->group_size(), me = group->group_rank();
  if (n == 1) return;
  at::Tensor mine = at::full({1}, static_cast<int64_t>(fnv1a(all) >> 1), at::kLong);
  at::Tensor hashes = at::empty({n}, at::kLong);
  group->all_gather(hashes, mine)->wait();
  const int64_t* h = hashes.data_ptr<int64_t>();
  bool same = true;
  for (int r = 1; r < n; ++r) same = same && h[r] == h[0];
  if (same) return;
  // Rank 0's entries, to every rank; each finds its first difference; every rank gathers them all.
  at::Tensor len = at::full({1}, static_cast<int64_t>(all.size()), at::kLong);
  group->broadcast(len)->wait();
  at::Tensor text = at::zeros({len.item<int64_t>()}, at::kInt);  // one character per element
  if (me == 0) {
    for (size_t k = 0; k < all.size(); ++k) text.data_ptr<int32_t>()[k] = static_cast<unsigned char>(all[k]);
  }
  group->broadcast(text)->wait();
  std::vector<std::string> theirs;
  {
    std::string s(text.data_ptr<int32_t>(), text.data_ptr<int32_t>() + text.numel());
    size_t start = 0;
    for (size_t nl; (nl = s.find('\n', start)) != std::string::npos; start = nl + 1)
      theirs.push_back(s.substr(start, nl - start));
  }
  std::string diff;
  for (size_t k = 0; k < std::max(entries.size(), theirs.size()) && diff.empty(); ++k) {
    std::string a = k < entries.size() ? entries[k] : "nothing",
                b = k < theirs.size() ? theirs[k] : "nothing";
    if (a != b) diff = str_cat("has ", a, " where rank 0 has ", b);
  }
  if (diff.empty()) diff = "differs from rank 0";
  constexpr int64_t kWidth = 240;
  at::Tensor row = at::zeros({kWidth}, at::kInt);
  for (size_t k = 0; k < diff.size() && k + 1 < kWidth; ++k) {
    row.data_ptr<int32_t>()[k] = static_cast<unsigned char>(diff[k]);
  }
  at::Tensor rows = at::empty({n * kWidth}, at::kInt);
  group->all_gather(rows, row)->wait();
  std::string message;
  for (int r = 1; r < n; ++r) {
    if (h[r] == h[0]) continue;
    std::string text;
    for (const int32_t* c = rows.data_ptr<int32_t>() + r * kWidth; *c != 0; ++c)
      text += static_cast<char>(*c);
    message += str_cat(message.empty() ? "" : "; ", "rank ", r, " ", text);
  }
  throw ValueError(str_cat(rank_prefix(), " data_parallel: the ranks hold different modules: ", message,
                           ". Build the same module (same code and configuration) on every rank."));
}

}  // namespace

RowRange split_rows(int64_t rows, int64_t parts, int64_t index) {
  DTRAIN_ASSERT(parts > 0 && index >= 0 && index < parts, "split_rows: bad part");
  const int64_t base = rows / parts, extra = rows % parts;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

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
    : DataParallel(module, std::move(group), opts, 0, nullptr) {}

DataParallel::DataParallel(torch::nn::Module& module, comm::BackendPtr group, DataParallelOptions opts,
                           int zero_stage, comm::BackendPtr replicate)
    : impl_(std::make_shared<Impl>()) {
  if (replicate && zero_stage != 3) {
    throw NotSupportedError("data_parallel: replica groups (hsdp) are for ZeRO-3 only.");
  }
  if (zero_stage > 0) {
    if (opts.side_values != 0) {
      throw NotSupportedError(
          "zero: side_values (reduce_with_gradients) is for data parallel only: ZeRO reduces "
          "each value to one rank. All-reduce such values yourself.");
    }
    opts.rebuild_buckets = false;  // the shards and the optimizer over them are laid out once
  }
  if (opts.reduce_dtype && !at::isFloatingType(*opts.reduce_dtype)) {
    throw ValueError(
        str_cat("data_parallel: reduce_dtype ", c10::toString(*opts.reduce_dtype),
                " is not a floating-point dtype. Use float32, bfloat16 or float16, or leave it unset "
                "(the parameters' dtype)."));
  }
  if (opts.deterministic) {
    const int64_t n = group->group_size();
    if (opts.side_values != 0 || (replicate && replicate->group_size() > 1) || (n & (n - 1)) != 0) {
      throw NotSupportedError(str_cat(
          "data_parallel: deterministic mode needs a group size that is a power of 2 (got ", n,
          "), no side_values (got ", opts.side_values, ") and no hsdp replicas", replicate ? " (given)" : "",
          ": its gradients are summed as one balanced tree over the step's micro-batches. Use 1, 2, 4, 8 "
          "... ranks, or turn deterministic mode off."));
    }
    opts.rebuild_buckets = false;  // (the tree's layout stays the same throughout)
  }
  impl_->zero_stage = zero_stage;
  if (opts.side_values < 0 || opts.side_values > 1024) {
    throw ValueError(
        str_cat("data_parallel: side_values ", opts.side_values, " must be between 0 and 1024."));
  }
  if (opts.bucket_bytes < 1 || opts.first_bucket_bytes < 1) {
    throw ValueError(str_cat("data_parallel: bucket sizes must be positive (bucket_bytes ", opts.bucket_bytes,
                             ", first_bucket_bytes ", opts.first_bucket_bytes, "). Use e.g. 25M and 1M."));
  }
  Impl& s = *impl_;
  s.group = std::move(group);
  if (replicate && replicate->group_size() > 1) s.replicate = std::move(replicate);
  s.opts = opts;
  std::vector<std::string> entries;
  std::unordered_set<const void*> seen;  // a parameter registered under two names counts once
  std::vector<at::Tensor> all_params;
  for (const auto& item : module.named_parameters(true)) {
    const at::Tensor& t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    entries.push_back(describe("parameter", item.key(), t));
    if (t.is_meta() && (zero_stage != 3 || !t.requires_grad())) {
      throw ValueError(str_cat(rank_prefix(), " ", zero_stage == 3 ? "zero" : "data_parallel",
                               ": parameter '", item.key(), "' is on the meta device",
                               zero_stage == 3 ? " and frozen (requires_grad false)" : "",
                               "; only ZeRO-3 makes trained parameters from the meta device (one at a time). "
                               "Build the module on the CPU, or use stage 3."));
    }
    if (!t.is_meta()) all_params.push_back(t);  // a meta one is broadcast once made
    if (t.requires_grad()) s.params.push_back({item.key(), t, t.sizes().vec()});
  }
  std::vector<std::string> meta_buffers;
  for (const auto& item : module.named_buffers(true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    entries.push_back(describe("buffer", item.key(), item.value()));
    s.buffers.push_back(item.value());
    meta_buffers.push_back(item.value().is_meta() ? item.key() : "");
    if (item.value().is_meta() && zero_stage != 3) {
      throw ValueError(
          str_cat(rank_prefix(), " data_parallel: buffer '", item.key(),
                  "' is on the meta device; only ZeRO-3 makes a module from the meta device. Build "
                  "the module on the CPU, or use stage 3."));
    }
  }
  // hsdp: first alike across the replicas (each shard group's rank 0 takes replica 0's values), then within
  // each shard group.
  for (const auto& g : {s.replicate, s.group}) {
    if (g) check_same_module(g, entries);
  }
  for (size_t k = 0; k < s.buffers.size(); ++k) {  // made whole (and broadcast) one by one
    if (!meta_buffers[k].empty()) s.become(s.buffers[k], s.made_whole(meta_buffers[k], s.buffers[k]));
  }
  for (const auto& g : {s.replicate, s.group}) {
    if (!g) continue;
    broadcast_coalesced(g, all_params);
    broadcast_coalesced(g, s.buffers);
  }
  if (zero_stage == 3) {
    s.layout_units(module);
  } else {
    std::vector<int> order;  // gradients come roughly in reverse registration order
    for (int i = static_cast<int>(s.params.size()) - 1; i >= 0; --i) order.push_back(i);
    s.layout(order);
  }
  if (zero_stage == 3) {
    s.shard_parameters_only(Impl::make_source(impl_));
  } else if (zero_stage > 0) {
    s.shard_buckets();
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(s.params[i].tensor,
                                                   std::make_unique<GradReadyHook>(&s, static_cast<int>(i)));
  }
}

void DataParallel::reduce_with_gradients(at::Tensor values) {
  if (values.dim() != 1 || values.numel() > impl_->opts.side_values || !values.is_contiguous()) {
    throw ValueError(str_cat(rank_prefix(),
                             " data_parallel: reduce_with_gradients takes a contiguous 1-d tensor of "
                             "at most DataParallelOptions::side_values (",
                             impl_->opts.side_values, ") elements; got ", values.sizes(),
                             ". Raise side_values when building it."));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->side = values;
}

DataParallel::~DataParallel() {
  for (auto& p : impl_->params) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  // ZeRO-3: the parameters (on demand) keep the shards and units alive through their source; letting go of
  // them here breaks the cycle.
  if (impl_->zero_stage == 3) {
    for (auto& p : impl_->params) p.tensor = at::Tensor();
  }
}

void DataParallel::set_requires_gradient_sync(bool sync) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->sync = sync;
}

bool DataParallel::requires_gradient_sync() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->sync;
}

std::vector<std::vector<std::string>> DataParallel::buckets() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets) {
    out.emplace_back();
    for (int i : b.params) out.back().push_back(impl_->params[i].name);
  }
  return out;
}

ModelStateMemory DataParallel::memory(const torch::optim::Optimizer* optimizer) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ModelStateMemory m;
  for (const auto& p : impl_->params) {
    if (impl_->zero_stage < 3) m.parameters += bytes_of(p.tensor);
    at::Tensor g = p.tensor.grad();
    // Gradients live in the buckets; one that does not (accumulating before the first reduction) is extra.
    const auto& b = impl_->buckets[p.bucket];
    if (g.defined() && (!b.flat.defined() || g.data_ptr() != impl_->slice(p).data_ptr()))
      m.buckets += bytes_of(g);
  }
  for (const auto& b : impl_->buckets) {
    if (impl_->zero_stage == 0) {
      m.gradients += bytes_of(b.flat);
    } else if (impl_->zero_stage == 1) {  // the full gradient buckets, this rank's shard reduced in them
      m.gradients += bytes_of(b.flat);
      m.buckets += bytes_of(b.shard_grad);  // the reduce-scatter's output, during a backward
    } else {  // ZeRO-2/3: this rank's reduced shard; a full bucket is a buffer while a backward needs it
      m.gradients += bytes_of(b.shard_grad);
      m.buckets += bytes_of(b.flat);
    }
    if (impl_->zero_stage == 3) {  // this rank's shard; a unit gathered at the moment is a buffer
      m.parameters += bytes_of(b.shard_param);
      m.buckets += bytes_of(b.params_flat);
    }
  }
  for (const auto& b : impl_->buffers) m.buffers += bytes_of(b);
  if (optimizer) m.optimizer_state = optimizer_state_bytes(*optimizer);
  return m;
}

const comm::BackendPtr& DataParallel::group() const { return impl_->group; }

PassTimeline DataParallel::last_pass() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->timeline;
}

std::vector<at::Tensor> DataParallel::shard_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& b : impl_->buckets) out.push_back(b.shard_param);
  return out;
}

void DataParallel::gather_parameters() { impl_->gather_params(); }

std::vector<DataParallel::ShardSegment> DataParallel::shard_segments() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<ShardSegment> out;
  const int64_t me = impl_->group->group_rank();
  for (size_t k = 0; k < impl_->buckets.size(); ++k) {
    const auto& b = impl_->buckets[k];
    const int64_t lo = b.start, hi = b.start + b.counts[me];
    for (int i : b.params) {
      const auto& p = impl_->params[i];
      const int64_t numel = c10::multiply_integers(p.sizes);
      const int64_t from = std::max(lo, p.offset), to = std::min(hi, p.offset + numel);
      if (to > from) out.push_back(ShardSegment{k, p.name, from - lo, to - from, from - p.offset, p.sizes});
    }
  }
  return out;
}

}  // namespace dtrain::parallel
