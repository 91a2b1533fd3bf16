// Deterministic mode of data parallel and ZeRO (DataParallelOptions::deterministic): the step's gradient is
// the sum of its micro-batches' gradients as one balanced binary tree, whatever the number of ranks.
//
// With c micro-batches per rank and N ranks (both powers of 2), rank r holds leaves r*c .. r*c + c - 1. Its
// subtree is summed locally as the backwards come (a stack: two partial sums over equal runs merge at once,
// left + right, as a binary counter carries); the N subtrees are then the tree's top N leaves. One
// all-to-all gives each rank every rank's partial of its own part of each bucket (the ZeRO shard, or an even
// part under data parallel); summed pairwise in rank order ((r0 + r1) + (r2 + r3)) it is exactly the tree's
// root there, the same bits as one process summing all c*N micro-batches the same way. Data parallel then
// all-gathers the parts; ZeRO keeps its shard. The sum is not divided: the loop scales each micro-batch's
// loss by 1/(c*N), the same at any N, so that even fp16's gradients (whose range a scale moves) are the same
// bits before the sum.
#include <ATen/ATen.h>

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "parallel/data_parallel.h"
#include "parallel/detail/data_parallel_impl.h"
#include "parallel/parallelize.h"
#include "tensor/comm_log.h"

namespace dtrain::parallel {

using namespace detail;

namespace {

// Rows of `t` ([k, c], k a power of 2) summed as a balanced binary tree, adjacent pairs first.
at::Tensor tree_sum(at::Tensor t) {
  const int64_t c = t.size(1);
  while (t.size(0) > 1) {
    const int64_t k = t.size(0);
    t = t.view({k / 2, 2, c});
    t = t.select(1, 0) + t.select(1, 1);
  }
  return t.view({-1});
}

void record(const char* what, tensor::StepKind kind, int64_t bytes, Clock::time_point t0) {
  tensor::CommLog::instance().record(tensor::CommRecord{
      what, kind, 0, bytes, 0.0, std::chrono::duration<double>(Clock::now() - t0).count()});
}

}  // namespace

std::vector<int64_t> DataParallel::Impl::shard_counts(int64_t numel) const {
  const int64_t n = group->group_size();
  std::vector<int64_t> counts;
  if (!opts.deterministic) {
    for (int64_t r = 0; r < n; ++r) counts.push_back(split_rows(numel, n, r).count);
    return counts;
  }
  const int64_t blocks = (numel + kDetBlock - 1) / kDetBlock;
  for (int64_t r = 0; r < n; ++r) {
    const RowRange b = split_rows(blocks, n, r);
    counts.push_back(
        std::max<int64_t>(0, std::min(numel, (b.start + b.count) * kDetBlock) - b.start * kDetBlock));
  }
  return counts;
}

std::vector<std::vector<int64_t>> DataParallel::shard_counts() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::vector<int64_t>> out;
  for (const auto& b : impl_->buckets) out.push_back(b.counts);
  return out;
}

void DataParallel::Impl::det_finish_pass() {
  std::lock_guard<std::mutex> lock(mu);
  in_pass = false;
  at::NoGradGuard no_grad;
  Partial leaf;
  std::vector<std::string> unused;
  for (const Bucket& b : buckets) {
    at::Tensor flat = at::zeros({b.numel}, grad_options(params[b.params.front()]));
    for (int i : b.params) {
      Param& p = params[i];
      const at::Tensor g = p.tensor.grad();
      if (!g.defined()) {
        unused.push_back(p.name);
        continue;
      }
      alias(flat, p.offset, p.sizes).copy_(g);
      p.tensor.mutable_grad().reset();
    }
    leaf.flats.push_back(flat);
  }
  if (!unused.empty() && !opts.allow_unused) {
    throw ValueError(str_cat(rank_prefix(), " data_parallel (deterministic): ", unused.size(),
                             " parameters received no gradient in this backward, the first '", unused.front(),
                             "'. Set DataParallelOptions::allow_unused if that is intended."));
  }
  partials.push_back(std::move(leaf));
  while (partials.size() >= 2 &&
         partials[partials.size() - 1].leaves == partials[partials.size() - 2].leaves) {
    Partial right = std::move(partials.back());
    partials.pop_back();
    Partial& left = partials.back();
    for (size_t k = 0; k < left.flats.size(); ++k) left.flats[k].add_(right.flats[k]);
    left.leaves *= 2;
  }
  if (sync) det_reduce();
}

void DataParallel::Impl::det_reduce() {
  if (partials.size() != 1) {
    int64_t count = 0;
    for (const auto& p : partials) count += p.leaves;
    partials.clear();
    throw ValueError(str_cat(
        rank_prefix(), " data_parallel (deterministic): this step had ", count,
        " micro-batches (backward passes) on this rank; deterministic mode sums them as a balanced tree, "
        "which needs a power of 2 (1, 2, 4, ...), the same on every rank. Change the accumulation."));
  }
  Partial mine = std::move(partials.back());
  partials.clear();
  const int64_t n = group->group_size(), me = group->group_rank();
  const auto t0 = Clock::now();
  pass_start = t0;
  for (size_t k = 0; k < buckets.size(); ++k) {
    Bucket& b = buckets[k];
    at::Tensor& flat = mine.flats[k];
    const std::vector<int64_t> counts = zero_stage == 0 ? shard_counts(b.numel) : b.counts;
    at::Tensor part;
    if (n == 1) {
      part = flat;
    } else {
      at::Tensor received = at::empty({n * counts[me]}, flat.options());
      tensor::CommCause cause("deterministic");
      group->all_to_all_v(received, flat, counts, std::vector<int64_t>(n, counts[me]))->wait();
      record("deterministic", tensor::StepKind::kAllToAll, bytes_of(flat), t0);
      part = tree_sum(received.view({n, counts[me]}));
    }
    if (zero_stage == 0) {
      if (n == 1) {
        b.flat.copy_(part);
      } else {
        group->all_gather_v(b.flat, part.contiguous(), counts)->wait();
        record("deterministic", tensor::StepKind::kAllGather, bytes_of(b.flat), t0);
      }
      for (int i : b.params) params[i].tensor.mutable_grad() = slice(params[i]);
    } else if (zero_stage == 1) {  // the reduced shard in its place in the full bucket, as finish_pass
      at::Tensor own = alias(b.flat, b.start, {counts[me]});
      own.copy_(part);
      b.shard_param.mutable_grad() = own;
    } else {
      b.shard_grad = alias(part, 0, {counts[me]});  // (not a view: optimizers detach_() their gradients)
      b.shard_param.mutable_grad() = b.shard_grad;
      b.flat = at::Tensor();
    }
  }
  timeline = PassTimeline{};
  timeline.end_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (zero_stage == 3) release_units();
  ++passes;
  sync_buffers();
}

at::Tensor Parallelized::gradient_block_squares() const {
  DTRAIN_ASSERT(zero_ != nullptr, "gradient_block_squares is for ZeRO");
  constexpr int64_t kBlock = DataParallel::Impl::kDetBlock;
  const auto counts = zero_->shard_counts();
  std::vector<at::Tensor> shards;
  for (const auto& g : zero_->optimizer().param_groups()) {
    for (const auto& p : g.params()) shards.push_back(p);
  }
  DTRAIN_ASSERT(shards.size() == counts.size(), "one optimizer tensor per ZeRO bucket");
  const int64_t n = world_->group_size(), me = world_->group_rank();
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
  const auto t0 = Clock::now();
  world_->all_gather_v(all, local, per_rank)->wait();
  record("clip_grad_norm", tensor::StepKind::kAllGather, total * 8, t0);
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
