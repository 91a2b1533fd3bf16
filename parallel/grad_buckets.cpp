// The gradient buckets shared by data parallel and ZeRO; see detail/grad_buckets.h.
#include "parallel/detail/grad_buckets.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <map>

#include "comm/comm_log.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::parallel::detail {

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

at::Tensor alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor s = at::empty({0}, flat.options());
  s.set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return s;
}

std::vector<int64_t> flat_cut(int64_t numel, int64_t n, bool deterministic) {
  if (!deterministic) return balanced_counts(numel, n);
  std::vector<int64_t> counts;
  const int64_t blocks = (numel + kDetBlock - 1) / kDetBlock;
  for (int64_t r = 0; r < n; ++r) {
    const Range b = balanced_part(blocks, n, r);
    counts.push_back(
        std::max<int64_t>(0, std::min(numel, (b.start + b.count) * kDetBlock) - b.start * kDetBlock));
  }
  return counts;
}

void GradBuckets::sync_buffers() {
  if (replicate) broadcast_coalesced(replicate, buffers);
  broadcast_coalesced(group, buffers);
}

at::Tensor GradBuckets::slice(const Param& p) {
  Bucket& b = buckets[p.bucket];
  if (!b.flat.defined()) b.flat = at::zeros({b.numel}, grad_options(p));  // ZeRO-2/3
  return alias(b.flat, p.offset, p.sizes);
}

std::vector<std::vector<int>> bucket_groups(const std::vector<int>& order,
                                            const std::vector<BucketItem>& items, int64_t first_cap,
                                            int64_t cap) {
  std::vector<std::vector<int>> groups;
  int64_t limit = first_cap, bytes = 0;
  for (int i : order) {
    const BucketItem& item = items[i];
    const bool fresh =
        groups.empty() || items[groups.back().front()].dtype != item.dtype || bytes + item.bytes > limit;
    if (fresh) {
      if (!groups.empty()) limit = cap;
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += item.bytes;
  }
  return groups;
}

int64_t GradBuckets::bucket_bytes(size_t k) const {
  const Bucket& b = buckets[k];
  return b.numel * static_cast<int64_t>(grad_options(params[b.params.front()]).dtype().itemsize());
}

int64_t GradBuckets::part_bytes(size_t k) const {
  const Bucket& b = buckets[k];
  const int64_t n = group->group_size();
  return flat_cut(b.numel, n, opts.deterministic)[group->group_rank()] *
         static_cast<int64_t>(grad_options(params[b.params.front()]).dtype().itemsize());
}

void GradBuckets::layout(const std::vector<int>& order) {
  std::vector<BucketItem> items;
  for (const Param& p : params) items.push_back({bytes_of(p.tensor), p.tensor.scalar_type()});
  layout_groups(bucket_groups(order, items, opts.first_bucket_bytes, opts.bucket_bytes));
}

void GradBuckets::layout_reversed() {
  std::vector<int> order;  // gradients come roughly in reverse registration order
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) order.push_back(i);
  layout(order);
}

void GradBuckets::layout_groups(const std::vector<std::vector<int>>& groups) {
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
    if (!reduction->frees_buckets()) {  // else made by each synchronised backward
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

void GradBuckets::check_same_layout(const std::string& shape) {
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

void GradBuckets::take(int i) {
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
  if (reduction->drops_param_grads()) params[i].tensor.mutable_grad().reset();
}

void GradBuckets::on_grad_ready(int i) {
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

void GradBuckets::start_pass() {
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

void GradBuckets::launch_ready() {
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
    comm::CommCause cause(reduction->cause());  // the reduction goes into CommLog under the strategy's name
    b.work = reduction->launch(next_launch - 1, {fingerprint, first});
  }
  // A strategy that frees its buckets: a full bucket goes as soon as its reduction is done (checked in
  // bucket order), and at most kMaxInFlight are awaiting theirs (the oldest is waited for), so that backward
  // holds a few at once, not every gradient.
  if (reduction->frees_buckets()) {
    constexpr size_t kMaxInFlight = 2;
    size_t in_flight = 0;
    for (size_t k = 0; k < next_launch; ++k) in_flight += buckets[k].reduced ? 0 : 1;
    for (size_t k = 0; k < next_launch; ++k) {
      if (buckets[k].reduced) continue;
      if (in_flight <= kMaxInFlight && !buckets[k].work->is_completed()) break;
      complete(k);
      --in_flight;
    }
  }
}

void GradBuckets::complete(size_t k) {
  Bucket& b = buckets[k];
  if (b.reduced) return;
  b.work->wait();
  b.reduced = true;
  b.work.reset();  // it holds the collective's buffers, where the engine has any
  if (reduction->frees_buckets()) b.flat = at::Tensor();
  reduction->reduced(k);
}

void GradBuckets::finish_pass() {
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
  for (size_t k = 0; k < buckets.size(); ++k) complete(k);
  reduction->land();
  timeline.end_s = since(Clock::now());
  reduction->after_pass();
  if (side.defined()) {
    const at::Tensor& last = buckets.back().flat;
    side.copy_(last.narrow(0, last.numel() - opts.side_values, side.numel()));
    side = at::Tensor();
  }
  if (++passes == 1 && opts.rebuild_buckets && params.size() > 1) rebuild();
  sync_buffers();
}

void GradBuckets::rebuild() {
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
  GradReadyHook(GradBuckets* engine, int index) : engine(engine), index(index) {}
  void operator()(const torch::autograd::Variable&) override { engine->on_grad_ready(index); }
  GradBuckets* engine;
  int index;
};

}  // namespace

void GradBuckets::install_hooks() {
  for (size_t i = 0; i < params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        params[i].tensor, std::make_unique<GradReadyHook>(this, static_cast<int>(i)));
  }
}

void GradBuckets::remove_hooks() {
  for (auto& p : params) {
    if (p.tensor.defined()) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }
}

std::vector<std::vector<std::string>> GradBuckets::bucket_names() const {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets) {
    out.emplace_back();
    for (int i : b.params) out.back().push_back(params[i].name);
  }
  return out;
}

ModelStateMemory GradBuckets::common_memory(bool count_parameters) const {
  ModelStateMemory m;
  for (const auto& p : params) {
    if (count_parameters) m.parameters += bytes_of(p.tensor);
    at::Tensor g = p.tensor.grad();
    // Gradients live in the buckets; one that does not (accumulating before the first reduction) is extra.
    const auto& b = buckets[p.bucket];
    if (g.defined() && (!b.flat.defined() || g.data_ptr() != alias(b.flat, p.offset, p.sizes).data_ptr()))
      m.buckets += bytes_of(g);
  }
  for (const auto& b : buffers) m.buffers += bytes_of(b);
  return m;
}

}  // namespace dtrain::parallel::detail
