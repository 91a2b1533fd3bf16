// Set-up of the gradient buckets' module (detail/grad_buckets.h): the ranks hold the same module, rank 0's
// values everywhere, tensors on the meta device made whole one at a time.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "parallel/detail/grad_buckets.h"

namespace dtrain::parallel::detail {

namespace {

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

void GradBuckets::check_options(const char* who) const {
  if (opts.reduce_dtype && !at::isFloatingType(*opts.reduce_dtype)) {
    throw ValueError(
        str_cat(who, ": reduce_dtype ", c10::toString(*opts.reduce_dtype),
                " is not a floating-point dtype. Use float32, bfloat16 or float16, or leave it unset "
                "(the parameters' dtype)."));
  }
  if (opts.deterministic) {
    const int64_t n = group->group_size();
    if (opts.side_values != 0 || replicas() > 1 || (n & (n - 1)) != 0) {
      throw NotSupportedError(str_cat(
          who, ": deterministic mode needs a group size that is a power of 2 (got ", n,
          "), no side_values (got ", opts.side_values, ") and no hsdp replicas",
          replicas() > 1 ? " (given)" : "",
          ": its gradients are summed as one balanced tree over the step's micro-batches. Use 1, 2, 4, 8 "
          "... ranks, or turn deterministic mode off."));
    }
  }
  if (opts.side_values < 0 || opts.side_values > 1024) {
    throw ValueError(str_cat(who, ": side_values ", opts.side_values, " must be between 0 and 1024."));
  }
  if (opts.bucket_bytes < 1 || opts.first_bucket_bytes < 1) {
    throw ValueError(str_cat(who, ": bucket sizes must be positive (bucket_bytes ", opts.bucket_bytes,
                             ", first_bucket_bytes ", opts.first_bucket_bytes, "). Use e.g. 25M and 1M."));
  }
}

void GradBuckets::collect(torch::nn::Module& module, bool meta_allowed, const char* who) {
  std::vector<std::string> entries;
  std::unordered_set<const void*> seen;  // a parameter registered under two names counts once
  std::vector<at::Tensor> all_params;
  for (const auto& item : module.named_parameters(true)) {
    const at::Tensor& t = item.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    entries.push_back(describe("parameter", item.key(), t));
    if (t.is_meta() && (!meta_allowed || !t.requires_grad())) {
      throw ValueError(str_cat(rank_prefix(), " ", who, ": parameter '", item.key(),
                               "' is on the meta device",
                               meta_allowed ? " and frozen (requires_grad false)" : "",
                               "; only ZeRO-3 makes trained parameters from the meta device (one at a time). "
                               "Build the module on the CPU, or use stage 3."));
    }
    if (!t.is_meta()) all_params.push_back(t);  // a meta one is broadcast once made
    if (t.requires_grad()) params.push_back({item.key(), t, t.sizes().vec()});
  }
  std::vector<std::string> meta_buffers;
  for (const auto& item : module.named_buffers(true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    entries.push_back(describe("buffer", item.key(), item.value()));
    buffers.push_back(item.value());
    meta_buffers.push_back(item.value().is_meta() ? item.key() : "");
    if (item.value().is_meta() && !meta_allowed) {
      throw ValueError(
          str_cat(rank_prefix(), " ", who, ": buffer '", item.key(),
                  "' is on the meta device; only ZeRO-3 makes a module from the meta device. Build "
                  "the module on the CPU, or use stage 3."));
    }
  }
  // hsdp: first alike across the replicas (each shard group's rank 0 takes replica 0's values), then within
  // each shard group.
  for (const auto& g : {replicate, group}) {
    if (g) check_same_module(g, entries);
  }
  for (size_t k = 0; k < buffers.size(); ++k) {  // made whole (and broadcast) one by one
    if (!meta_buffers[k].empty()) become(buffers[k], made_whole(meta_buffers[k], buffers[k]));
  }
  for (const auto& g : {replicate, group}) {
    if (!g) continue;
    broadcast_coalesced(g, all_params);
    broadcast_coalesced(g, buffers);
  }
}

at::Tensor GradBuckets::made_whole(const std::string& name, const at::Tensor& meta) {
  if (!materialize) {
    throw ValueError(
        str_cat(rank_prefix(), " zero: '", name,
                "' is on the meta device and ZeroOptions::materialize is not set. Set it "
                "to a function giving each tensor its initial values, or build the module on the CPU."));
  }
  at::Tensor whole = at::empty(meta.sizes(), meta.options().device(at::kCPU).requires_grad(false));
  materialize(name, whole);
  for (const auto& g : {replicate, group}) {
    if (g && g->group_size() > 1) g->broadcast(whole)->wait();
  }
  return whole;
}

void GradBuckets::become(at::Tensor& t, const at::Tensor& what) {
  if (!t.is_meta()) {
    t.set_data(what);
    return;
  }
  t.unsafeGetTensorImpl()->shallow_copy_from(what.getIntrusivePtr());
  if (auto* meta = torch::autograd::impl::get_autograd_meta(t)) meta->grad_accumulator_.reset();
}

}  // namespace dtrain::parallel::detail
