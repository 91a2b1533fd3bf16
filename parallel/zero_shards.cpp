// ZeRO's part of DataParallel::Impl (parallel/detail/data_parallel_impl.h): stages 1 and 2 cut each bucket
// into per-rank shards and all-gather the updated shards after the step; stage 3 keeps only the shards, makes
// the parameters on-demand tensors (tensor/on_demand.h) and gathers them by unit, just in time
// (docs/architecture.md, "ZeRO-3").
#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "parallel/detail/data_parallel_impl.h"
#include "tensor/comm_log.h"
#include "tensor/layout_keys.h"

namespace dtrain::parallel {

using namespace detail;

namespace {

struct Zero3Source : tensor::OnDemandSource {
  explicit Zero3Source(std::shared_ptr<DataParallel::Impl> impl) : impl(std::move(impl)) {}
  at::Tensor acquire(int index) override { return impl->acquire(index); }
  void written(int index, const at::Tensor& whole) override { impl->written(index, whole); }
  std::shared_ptr<DataParallel::Impl> impl;
};

// ZeRO-3's units, in registration order: whole submodules where they fit in `cap` bytes (a module that does
// not fit gives its own parameters as one piece and its children their own), consecutive pieces of one dtype
// merged while they fit, as FSDP's size-based wrapping does. `index` maps a parameter's qualified name to
// its index in `params` (parameters not there, frozen or registered twice, are skipped).
void unit_pieces(const torch::nn::Module& m, const std::string& prefix,
                 const std::map<std::string, int>& index, const std::vector<int64_t>& bytes, int64_t cap,
                 std::vector<std::vector<int>>& out) {
  std::vector<int> all;
  int64_t total = 0;
  for (const auto& item : m.named_parameters(true)) {
    auto it = index.find(prefix + item.key());
    if (it == index.end()) continue;
    all.push_back(it->second);
    total += bytes[it->second];
  }
  if (all.empty()) return;
  if (total <= cap) {
    out.push_back(all);
    return;
  }
  std::vector<int> own;
  for (const auto& item : m.named_parameters(false)) {
    auto it = index.find(prefix + item.key());
    if (it != index.end()) own.push_back(it->second);
  }
  if (!own.empty()) out.push_back(own);
  for (const auto& child : m.named_children()) {
    unit_pieces(*child.value(), prefix + child.key() + ".", index, bytes, cap, out);
  }
}

}  // namespace

std::shared_ptr<tensor::OnDemandSource> DataParallel::Impl::make_source(std::shared_ptr<Impl> self) {
  return std::make_shared<Zero3Source>(std::move(self));
}

// ZeRO-3: buckets from unit_pieces(), merged while they fit, in launch order (the reverse of registration).
void DataParallel::Impl::layout_units(const torch::nn::Module& module) {
  // Units in registration order (roughly forward's order of use); buckets in launch order, the reverse.
  std::map<std::string, int> index;
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < params.size(); ++i) {
    index[params[i].name] = static_cast<int>(i);
    bytes.push_back(bytes_of(params[i].tensor));
  }
  std::vector<std::vector<int>> pieces, units;
  unit_pieces(module, "", index, bytes, opts.bucket_bytes, pieces);
  int64_t unit_bytes = 0;
  for (auto& piece : pieces) {
    int64_t b = 0;
    for (int i : piece) b += bytes[i];
    const auto dtype = [&](int i) { return params[i].tensor.scalar_type(); };
    bool split_dtype =
        std::any_of(piece.begin(), piece.end(), [&](int i) { return dtype(i) != dtype(piece[0]); });
    if (split_dtype) {  // a piece of several dtypes: one unit per dtype
      std::map<at::ScalarType, std::vector<int>> by;
      for (int i : piece) by[dtype(i)].push_back(i);
      for (auto& [d, v] : by) units.push_back(v);
      unit_bytes = opts.bucket_bytes;  // nothing merges into them
      continue;
    }
    if (!units.empty() && unit_bytes + b <= opts.bucket_bytes && dtype(units.back()[0]) == dtype(piece[0])) {
      units.back().insert(units.back().end(), piece.begin(), piece.end());
      unit_bytes += b;
    } else {
      units.push_back(piece);
      unit_bytes = b;
    }
  }
  std::reverse(units.begin(), units.end());
  layout_groups(units);
}

void DataParallel::Impl::shard_buckets() {
  const int64_t me = group->group_rank();
  at::NoGradGuard no_grad;
  for (auto& b : buckets) {
    const at::TensorOptions o = params[b.params.front()].tensor.options().requires_grad(false);
    b.params_flat = at::zeros({b.numel}, o);
    for (int i : b.params) {
      Param& p = params[i];
      at::Tensor home = alias(b.params_flat, p.offset, p.tensor.sizes());
      home.copy_(p.tensor);
      p.tensor.set_data(tensor::with_layout_keys(home, p.tensor.key_set()));  // a tp style's key stays
    }
    b.counts = shard_counts(b.numel);
    b.start = std::accumulate(b.counts.begin(), b.counts.begin() + me, int64_t{0});
    b.shard_grad = at::zeros({b.counts[me]}, grad_options(params[b.params.front()]));
    if (zero_stage == 1) b.shard_grad = at::Tensor();  // allocated for each reduction
    b.shard_param = alias(b.params_flat, b.start, {b.counts[me]}).requires_grad_(true);
    if (zero_stage == 2) b.flat = at::Tensor();
  }
}

void DataParallel::Impl::shard_parameters_only(const std::shared_ptr<tensor::OnDemandSource>& source) {
  const int64_t me = group->group_rank();
  at::NoGradGuard no_grad;
  for (auto& b : buckets) {
    const at::TensorOptions o =
        params[b.params.front()].tensor.options().device(at::kCPU).requires_grad(false);
    b.counts = shard_counts(b.numel);
    b.start = std::accumulate(b.counts.begin(), b.counts.begin() + me, int64_t{0});
    b.shard_param = at::zeros({b.counts[me]}, o);  // (shard_grad: made by the first reduction)
    b.flat = at::Tensor();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    at::Tensor whole = p.tensor.is_meta() ? made_whole(p.name, p.tensor) : p.tensor.detach();
    keep_own_part(static_cast<int>(i), whole);
    at::Tensor od = tensor::make_on_demand(source, static_cast<int>(i), whole, p.tensor.key_set());
    become(p.tensor, od);
  }
  for (auto& b : buckets) b.shard_param.requires_grad_(true);
}

at::Tensor DataParallel::Impl::made_whole(const std::string& name, const at::Tensor& meta) {
  if (!opts.materialize) {
    throw ValueError(
        str_cat(rank_prefix(), " zero: '", name,
                "' is on the meta device and DataParallelOptions::materialize is not set. Set it "
                "to a function giving each tensor its initial values, or build the module on the CPU."));
  }
  at::Tensor whole = at::empty(meta.sizes(), meta.options().device(at::kCPU).requires_grad(false));
  opts.materialize(name, whole);
  for (const auto& g : {replicate, group}) {
    if (g && g->group_size() > 1) g->broadcast(whole)->wait();
  }
  return whole;
}

void DataParallel::Impl::become(at::Tensor& t, const at::Tensor& what) {
  if (!t.is_meta()) {
    t.set_data(what);
    return;
  }
  t.unsafeGetTensorImpl()->shallow_copy_from(what.getIntrusivePtr());
  if (auto* meta = torch::autograd::impl::get_autograd_meta(t)) meta->grad_accumulator_.reset();
}

at::Tensor DataParallel::Impl::acquire(int i) {
  std::lock_guard<std::mutex> lock(units_mu);
  const Param& p = params[i];
  use_unit(p.bucket);
  return alias(buckets[p.bucket].params_flat, p.offset, p.sizes);
}

void DataParallel::Impl::written(int i, const at::Tensor& whole) {
  std::lock_guard<std::mutex> lock(units_mu);
  keep_own_part(i, whole);
}

void DataParallel::Impl::keep_own_part(int i, const at::Tensor& whole) {
  const Param& p = params[i];
  Bucket& b = buckets[p.bucket];
  at::NoGradGuard no_grad;
  const int64_t count = b.counts[group->group_rank()];
  const int64_t lo = std::max(p.offset, b.start), hi = std::min(p.offset + whole.numel(), b.start + count);
  if (lo < hi) {
    b.shard_param.detach()
        .narrow(0, lo - b.start, hi - lo)
        .copy_(whole.reshape({-1}).narrow(0, lo - p.offset, hi - lo));
  }
}

void DataParallel::Impl::use_unit(int u) {
  Units& z = units;
  const int phase = torch::autograd::get_current_graph_task_id() >= 0 ? 1 : 0;
  if (phase != z.phase) {
    if (z.phase >= 0) end_phase(z.phase);
    release_units_locked();
    z.phase = phase;
    z.pos[phase] = -1;
    z.run_started[phase] = false;
  }
  const bool recording = !z.recorded[phase];
  std::vector<int>& seq = z.seq[phase];
  if (u != z.current) {
    z.current = u;
    if (recording) {
      seq.push_back(u);
    } else {
      int& pos = z.pos[phase];
      int found = -1;
      for (int k = pos + 1; k < static_cast<int>(seq.size()) && found < 0; ++k)
        if (seq[k] == u) found = k;
      for (int k = 0; k <= pos && k < static_cast<int>(seq.size()) && found < 0; ++k)
        if (seq[k] == u) found = k;
      if (found >= 0) pos = found;
    }
  }
  ensure_gathered(u, phase);
  int next = -1;
  if (!recording && z.pos[phase] + 1 < static_cast<int>(seq.size()) && z.pos[phase] >= 0 &&
      seq[z.pos[phase]] == u) {
    next = seq[z.pos[phase] + 1];
    if (!buckets[next].params_flat.defined()) start_gather(next, phase);
  }
  for (size_t w = 0; w < buckets.size(); ++w) {
    const int k = static_cast<int>(w);
    if (k == u || k == next || (!z.pinned[phase].empty() && z.pinned[phase][w])) continue;
    if (buckets[w].params_flat.defined()) release_unit(k);
  }
}

void DataParallel::Impl::end_phase(int phase) {
  Units& z = units;
  if (z.recorded[phase]) return;
  z.recorded[phase] = true;
  z.pinned[phase].assign(buckets.size(), 0);
  std::vector<int> count(buckets.size(), 0);
  std::string text = str_cat(fingerprint, ":", phase, ":");
  for (int u : z.seq[phase]) {
    if (++count[u] > 1) z.pinned[phase][u] = 1;
    text += str_cat(u, ",");
  }
  z.fingerprint[phase] = fnv1a(text) | 2;
}

void DataParallel::Impl::start_gather(int u, int phase) {
  Bucket& b = buckets[u];
  Units& z = units;
  comm::AgreementRun run;  // the first pass: each gather checks itself
  if (z.recorded[phase]) {
    run = {z.fingerprint[phase], !z.run_started[phase]};
    z.run_started[phase] = true;
  }
  b.params_flat = at::empty({b.numel}, b.shard_param.options().requires_grad(false));
  b.gather_start = Clock::now();
  b.gather = group->all_gather_v(b.params_flat, b.shard_param.detach(), b.counts, {{}, run});
}

void DataParallel::Impl::ensure_gathered(int u, int phase) {
  if (!buckets[u].params_flat.defined()) start_gather(u, phase);
  finish_gather(u);
}

void DataParallel::Impl::finish_gather(int u) {
  Bucket& b = buckets[u];
  if (!b.gather) return;
  tensor::CommCause cause("zero3");
  b.gather->wait();
  b.gather.reset();
  tensor::CommLog::instance().record(tensor::CommRecord{
      tensor::CommCause::current(), tensor::StepKind::kAllGather, 0, bytes_of(b.shard_param),
      predicted_seconds(tensor::StepKind::kAllGather, bytes_of(b.params_flat), group->group_size()),
      std::chrono::duration<double>(Clock::now() - b.gather_start).count()});
}

void DataParallel::Impl::release_unit(int u) {
  finish_gather(u);  // a prefetch in flight: its buffer must outlive it
  buckets[u].params_flat = at::Tensor();
}

void DataParallel::Impl::release_units_locked() {
  for (size_t u = 0; u < buckets.size(); ++u) release_unit(static_cast<int>(u));
  units.current = -1;
}

void DataParallel::Impl::release_units() {
  std::lock_guard<std::mutex> lock(units_mu);
  if (units.phase >= 0) end_phase(units.phase);
  units.phase = -1;
  release_units_locked();
}

void DataParallel::Impl::gather_params() {
  if (zero_stage == 3) {
    release_units();
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  uint64_t run = fingerprint ^ 0x9e3779b97f4a7c15ull;
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> keep;
  std::vector<int64_t> b_bytes;  // each bucket's whole size
  Clock::time_point t0 = Clock::now();
  for (size_t k = 0; k < buckets.size(); ++k) {
    Bucket& b = buckets[k];
    keep.push_back(b.shard_param.detach().clone());
    b_bytes.push_back(bytes_of(b.params_flat));
    works.push_back(group->all_gather_v(b.params_flat, keep.back(), b.counts, {{}, {run | 2, k == 0}}));
  }
  for (size_t k = 0; k < buckets.size(); ++k) {
    tensor::CommCause cause("zero");
    works[k]->wait();
    tensor::CommLog::instance().record(
        tensor::CommRecord{tensor::CommCause::current(), tensor::StepKind::kAllGather, 0, bytes_of(keep[k]),
                           predicted_seconds(tensor::StepKind::kAllGather, b_bytes[k], group->group_size()),
                           std::chrono::duration<double>(Clock::now() - t0).count()});
  }
}

}  // namespace dtrain::parallel
