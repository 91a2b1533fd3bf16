// ZeRO's shards (detail/zero_state.h): each bucket cut into per-rank flat shards; stages 1 and 2 move the
// parameters into the buckets and all-gather the updated shards after the step; stage 3 lays the buckets out
// as units of whole submodules, keeps only the shards and makes the parameters on-demand tensors
// (dispatch/on_demand.h, gathered in zero3_units.cpp; docs/architecture.md, "ZeRO-3").
#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "comm/comm_log.h"
#include "core/error.h"
#include "core/log.h"
#include "dispatch/keys.h"
#include "parallel/detail/zero_state.h"

namespace dtrain::parallel::detail {

namespace {

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

// ZeRO-3: buckets from unit_pieces(), merged while they fit, in launch order (the reverse of registration).
void ZeroState::layout_units(const torch::nn::Module& module) {
  // Units in registration order (roughly forward's order of use); buckets in launch order, the reverse.
  std::map<std::string, int> index;
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < engine.params.size(); ++i) {
    index[engine.params[i].name] = static_cast<int>(i);
    bytes.push_back(bytes_of(engine.params[i].tensor));
  }
  std::vector<std::vector<int>> pieces, groups;
  unit_pieces(module, "", index, bytes, engine.opts.bucket_bytes, pieces);
  int64_t unit_bytes = 0;
  for (auto& piece : pieces) {
    int64_t b = 0;
    for (int i : piece) b += bytes[i];
    const auto dtype = [&](int i) { return engine.params[i].tensor.scalar_type(); };
    bool split_dtype =
        std::any_of(piece.begin(), piece.end(), [&](int i) { return dtype(i) != dtype(piece[0]); });
    if (split_dtype) {  // a piece of several dtypes: one unit per dtype
      std::map<at::ScalarType, std::vector<int>> by;
      for (int i : piece) by[dtype(i)].push_back(i);
      for (auto& [d, v] : by) groups.push_back(v);
      unit_bytes = engine.opts.bucket_bytes;  // nothing merges into them
      continue;
    }
    if (!groups.empty() && unit_bytes + b <= engine.opts.bucket_bytes &&
        dtype(groups.back()[0]) == dtype(piece[0])) {
      groups.back().insert(groups.back().end(), piece.begin(), piece.end());
      unit_bytes += b;
    } else {
      groups.push_back(piece);
      unit_bytes = b;
    }
  }
  std::reverse(groups.begin(), groups.end());
  engine.layout_groups(groups);
}

void ZeroState::cut_buckets() {
  const int64_t me = engine.group->group_rank();
  shards.assign(engine.buckets.size(), Shard{});
  for (size_t k = 0; k < engine.buckets.size(); ++k) {
    Shard& z = shards[k];
    z.counts = flat_cut(engine.buckets[k].numel, engine.group->group_size(), engine.opts.deterministic);
    z.start = std::accumulate(z.counts.begin(), z.counts.begin() + me, int64_t{0});
  }
}

void ZeroState::shard_buckets() {
  const int64_t me = engine.group->group_rank();
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < engine.buckets.size(); ++k) {
    const GradBuckets::Bucket& b = engine.buckets[k];
    Shard& z = shards[k];
    const at::TensorOptions o = engine.params[b.params.front()].tensor.options().requires_grad(false);
    z.params_flat = at::zeros({b.numel}, o);
    for (int i : b.params) {
      GradBuckets::Param& p = engine.params[i];
      at::Tensor home = alias(z.params_flat, p.offset, p.tensor.sizes());
      home.copy_(p.tensor);
      p.tensor.set_data(dispatch::with_layout_keys(home, p.tensor.key_set()));  // a tp style's key stays
    }
    // (stage 1 allocates it for each reduction)
    if (stage == 2)
      z.shard_grad = at::zeros({z.counts[me]}, engine.grad_options(engine.params[b.params.front()]));
    z.shard_param = alias(z.params_flat, z.start, {z.counts[me]}).requires_grad_(true);
  }
}

void ZeroState::shard_parameters_only(const std::shared_ptr<dispatch::OnDemandSource>& source) {
  const int64_t me = engine.group->group_rank();
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < engine.buckets.size(); ++k) {
    const GradBuckets::Bucket& b = engine.buckets[k];
    const at::TensorOptions o =
        engine.params[b.params.front()].tensor.options().device(at::kCPU).requires_grad(false);
    shards[k].shard_param =
        at::zeros({shards[k].counts[me]}, o);  // (shard_grad: made by the first reduction)
  }
  for (size_t i = 0; i < engine.params.size(); ++i) {
    GradBuckets::Param& p = engine.params[i];
    at::Tensor whole = p.tensor.is_meta() ? engine.made_whole(p.name, p.tensor) : p.tensor.detach();
    keep_own_part(static_cast<int>(i), whole);
    at::Tensor od = dispatch::make_on_demand(source, static_cast<int>(i), whole, p.tensor.key_set());
    GradBuckets::become(p.tensor, od);
  }
  for (auto& z : shards) z.shard_param.requires_grad_(true);
}

void ZeroState::keep_own_part(int i, const at::Tensor& whole) {
  const GradBuckets::Param& p = engine.params[i];
  Shard& z = shards[p.bucket];
  at::NoGradGuard no_grad;
  const int64_t count = z.counts[engine.group->group_rank()];
  const int64_t lo = std::max(p.offset, z.start), hi = std::min(p.offset + whole.numel(), z.start + count);
  if (lo < hi) {
    z.shard_param.detach()
        .narrow(0, lo - z.start, hi - lo)
        .copy_(whole.reshape({-1}).narrow(0, lo - p.offset, hi - lo));
  }
}

void ZeroState::gather_params() {
  if (stage == 3) {
    release_units();
    return;
  }
  std::lock_guard<std::mutex> lock(engine.mu);
  const comm::BackendPtr& group = engine.group;
  uint64_t run = engine.fingerprint ^ 0x9e3779b97f4a7c15ull;
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> keep;
  comm::CommCause cause("zero");
  for (size_t k = 0; k < shards.size(); ++k) {
    Shard& z = shards[k];
    keep.push_back(z.shard_param.detach().clone());
    works.push_back(group->all_gather_v(z.params_flat, keep.back(), z.counts, {{}, {run | 2, k == 0}}));
  }
  for (auto& w : works) w->wait();
}

}  // namespace dtrain::parallel::detail
