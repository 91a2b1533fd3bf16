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

#include "comm/comm_log.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/detail/grad_buckets.h"

namespace dtrain::parallel::detail {

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

}  // namespace

void GradBuckets::det_finish_pass() {
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

void GradBuckets::det_reduce() {
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
    const std::vector<int64_t> counts = flat_cut(b.numel, n, true);
    at::Tensor part;
    if (n == 1) {
      part = flat;
    } else {
      at::Tensor received = at::empty({n * counts[me]}, flat.options());
      comm::CommCause cause("deterministic");
      group->all_to_all_v(received, flat, counts, std::vector<int64_t>(n, counts[me]))->wait();
      part = tree_sum(received.view({n, counts[me]}));
    }
    reduction->det_land(k, part, counts);
  }
  timeline = PassTimeline{};
  timeline.end_s = std::chrono::duration<double>(Clock::now() - t0).count();
  reduction->after_pass();
  ++passes;
  sync_buffers();
}

void GradBuckets::det_gather_parts(size_t k, const at::Tensor& part, const std::vector<int64_t>& counts) {
  Bucket& b = buckets[k];
  if (group->group_size() == 1) {
    b.flat.copy_(part);
  } else {
    comm::CommCause cause("deterministic");
    group->all_gather_v(b.flat, part.contiguous(), counts)->wait();
  }
  for (int i : b.params) params[i].tensor.mutable_grad() = slice(params[i]);
}

}  // namespace dtrain::parallel::detail
