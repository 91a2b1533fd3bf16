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

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
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

namespace dtrain::parallel {

namespace {

using Clock = std::chrono::steady_clock;

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

// Group rank 0's values of `tensors`, broadcast in one flat buffer per dtype.
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

}  // namespace

struct DataParallel::Impl {
  struct Param {
    std::string name;
    at::Tensor tensor;
    int bucket = -1;
    int64_t offset = 0;  // elements into the bucket
  };
  struct Bucket {
    at::Tensor flat;
    std::vector<int> params;
    int pending = 0;  // params of this pass not in yet
    comm::WorkPtr work;
    Clock::time_point launched;
  };

  comm::BackendPtr group;
  DataParallelOptions opts;
  std::vector<Param> params;  // registration order
  std::vector<at::Tensor> buffers;
  std::vector<Bucket> buckets;  // launch order

  std::mutex mu;
  bool sync = true;          // guarded by mu
  bool in_pass = false;      // guarded by mu
  int passes = 0;            // guarded by mu: completed passes with sync on
  size_t next_launch = 0;    // guarded by mu
  std::vector<char> ready;   // guarded by mu: per param, this pass
  std::vector<int> arrival;  // guarded by mu: params in the order their gradients came, this pass

  // The param's part of its bucket, shaped like the param. Not an autograd view but a plain tensor on the
  // bucket's storage, so that it can be a .grad: optimizers' zero_grad() calls detach_(), which views refuse.
  at::Tensor slice(const Param& p) const {
    const at::Tensor& flat = buckets[p.bucket].flat;
    at::Tensor s = at::empty({0}, flat.options());
    s.set_(flat.storage(), flat.storage_offset() + p.offset, p.tensor.sizes(),
           c10::contiguous_strides(p.tensor.sizes()));
    return s;
  }

  // Buckets in `order` (param indices): a new bucket when the dtype changes or the next param would overflow
  // the cap (the first bucket's cap is first_bucket_bytes). Gradients already present move into the new
  // slices.
  void layout(const std::vector<int>& order) {
    std::vector<at::Tensor> grads(params.size());
    for (size_t i = 0; i < params.size(); ++i) grads[i] = params[i].tensor.grad();
    std::vector<Bucket> next;
    std::vector<int64_t> elements;
    int64_t cap = opts.first_bucket_bytes, bytes = 0;
    for (int i : order) {
      Param& p = params[i];
      const int64_t b = bytes_of(p.tensor);
      bool fresh = next.empty() ||
                   params[next.back().params.front()].tensor.scalar_type() != p.tensor.scalar_type() ||
                   bytes + b > cap;
      if (fresh) {
        if (!next.empty()) cap = opts.bucket_bytes;
        next.emplace_back();
        elements.push_back(0);
        bytes = 0;
      }
      p.bucket = static_cast<int>(next.size()) - 1;
      p.offset = elements.back();
      next.back().params.push_back(i);
      elements.back() += p.tensor.numel();
      bytes += b;
    }
    for (size_t k = 0; k < next.size(); ++k) {
      next[k].flat =
          at::zeros({elements[k]}, params[next[k].params.front()].tensor.options().requires_grad(false));
    }
    buckets = std::move(next);
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor s = slice(params[i]);
      s.copy_(grads[i]);
      params[i].tensor.mutable_grad() = s;
    }
  }

  void on_grad_ready(int i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!sync) return;
    if (!in_pass) start_pass();
    if (ready[i]) return;
    const Param& p = params[i];
    at::Tensor g = p.tensor.grad();
    at::Tensor s = slice(p);
    at::NoGradGuard no_grad;
    if (!g.defined()) {
      s.zero_();
    } else if (g.data_ptr() != s.data_ptr()) {
      s.copy_(g);
    }
    ready[i] = 1;
    arrival.push_back(i);
    if (--buckets[p.bucket].pending == 0) launch_ready();
  }

  void start_pass() {
    in_pass = true;
    ready.assign(params.size(), 0);
    arrival.clear();
    next_launch = 0;
    for (auto& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.work.reset();
    }
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_pass(); });
  }

  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.launched = Clock::now();
      b.work = group->all_reduce(b.flat, {comm::ReduceOp::kAvg});
    }
  }

  void finish_pass() {
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
        const Param& p = params[i];
        at::Tensor g = p.tensor.grad(), s = slice(p);
        if (g.defined() && g.data_ptr() != s.data_ptr()) {
          s.copy_(g);
        } else if (!g.defined()) {
          s.zero_();
        }
        if (--buckets[p.bucket].pending == 0) launch_ready();
      }
    }
    for (auto& b : buckets) {
      tensor::CommCause cause("data_parallel");
      b.work->wait();
      tensor::CommLog::instance().record(
          tensor::CommRecord{tensor::CommCause::current(), tensor::StepKind::kAllReduce, 0, bytes_of(b.flat),
                             0, std::chrono::duration<double>(Clock::now() - b.launched).count()});
    }
    for (const Param& p : params) {
      at::Tensor s = slice(p);
      if (!p.tensor.grad().defined() || p.tensor.grad().data_ptr() != s.data_ptr())
        p.tensor.mutable_grad() = s;
    }
    if (++passes == 1 && opts.rebuild_buckets && params.size() > 1) rebuild();
    broadcast_coalesced(group, buffers);
  }

  // The first pass's arrival order (group rank 0's, so that every rank lays out the same buckets), the params
  // that got none last.
  void rebuild() {
    std::vector<int> order = arrival;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      if (!ready[i]) order.push_back(i);
    }
    at::Tensor t = at::tensor(std::vector<int64_t>(order.begin(), order.end()), at::kLong);
    if (group->group_size() > 1) group->broadcast(t)->wait();
    std::vector<int> agreed(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    layout(agreed);
  }
};

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
    : impl_(std::make_unique<Impl>()) {
  if (opts.bucket_bytes < 1 || opts.first_bucket_bytes < 1) {
    throw ValueError(str_cat("data_parallel: bucket sizes must be positive (bucket_bytes ", opts.bucket_bytes,
                             ", first_bucket_bytes ", opts.first_bucket_bytes, "). Use e.g. 25M and 1M."));
  }
  Impl& s = *impl_;
  s.group = std::move(group);
  s.opts = opts;
  std::vector<std::string> entries;
  std::unordered_set<const void*> seen;  // a parameter registered under two names counts once
  std::vector<at::Tensor> all_params;
  for (const auto& item : module.named_parameters(true)) {
    const at::Tensor& t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    entries.push_back(describe("parameter", item.key(), t));
    all_params.push_back(t);
    if (t.requires_grad()) s.params.push_back({item.key(), t});
  }
  for (const auto& item : module.named_buffers(true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    entries.push_back(describe("buffer", item.key(), item.value()));
    s.buffers.push_back(item.value());
  }
  check_same_module(s.group, entries);
  broadcast_coalesced(s.group, all_params);
  broadcast_coalesced(s.group, s.buffers);
  std::vector<int> order;  // gradients come roughly in reverse registration order
  for (int i = static_cast<int>(s.params.size()) - 1; i >= 0; --i) order.push_back(i);
  s.layout(order);
  for (size_t i = 0; i < s.params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(s.params[i].tensor,
                                                   std::make_unique<GradReadyHook>(&s, static_cast<int>(i)));
  }
}

DataParallel::~DataParallel() {
  for (auto& p : impl_->params) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
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
    m.parameters += bytes_of(p.tensor);
    at::Tensor g = p.tensor.grad();
    // Gradients live in the buckets; one that does not (accumulating before the first reduction) is extra.
    if (g.defined() && g.data_ptr() != impl_->slice(p).data_ptr()) m.buckets += bytes_of(g);
  }
  for (const auto& b : impl_->buckets) m.gradients += bytes_of(b.flat);
  for (const auto& b : impl_->buffers) m.buffers += bytes_of(b);
  if (optimizer) m.optimizer_state = optimizer_state_bytes(*optimizer);
  return m;
}

const comm::BackendPtr& DataParallel::group() const { return impl_->group; }

}  // namespace dtrain::parallel
