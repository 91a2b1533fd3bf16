// How data parallel and ZeRO reduce gradients (parallel/detail/grad_buckets.h, the engine they share): bucket
// sizes, unused parameters, bucket order, side values, the reduction dtype, deterministic mode. Data
// parallel's options are exactly these (DataParallelOptions); ZeRO adds its own (ZeroOptions,
// parallel/zero.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace dtrain::parallel {

struct GradReductionOptions {
  // Bucket size in bytes (DDP's bucket_cap_mb, Horovod's HOROVOD_FUSION_THRESHOLD).
  int64_t bucket_bytes = int64_t{25} << 20;
  // The first bucket (the gradients backward produces first: the last layers) is small, so that
  // communication starts early, as DDP does.
  int64_t first_bucket_bytes = int64_t{1} << 20;
  // A parameter that gets no gradient in a backward is an error naming it, unless this is set (DDP's
  // find_unused_parameters): it then contributes zeros.
  bool allow_unused = false;
  // After the first backward, buckets are laid out again in the order the gradients arrived (group rank 0's
  // order, so that every rank agrees), as DDP does.
  bool rebuild_buckets = true;
  // Slots at the end of the last bucket for reduce_with_gradients (0: none; the buckets then hold exactly
  // the gradients).
  int64_t side_values = 0;
  // The dtype gradients are reduced in (FSDP's reduce_dtype): the buckets, ZeRO's shards of them, and the
  // gradients the parameters end up with, e.g. fp32 for bf16 parameters (the sum of the ranks' 16-bit
  // gradients then rounded once, in the optimizer's fp32 master gradients). Unset: the parameters' dtype.
  std::optional<at::ScalarType> reduce_dtype;
  // Deterministic mode: gradients bitwise the same at any power-of-2 group size N. Each backward must be one
  // micro-batch of a fixed size, the same number c of them (a power of 2) on every rank per step, the step's
  // c*N micro-batches spread over the ranks in order (rank r takes micro-batches r*c .. r*c + c - 1), and
  // each micro-batch's loss scaled by 1/(c*N): the gradients are summed, not averaged over the ranks, as one
  // balanced binary tree over the step's micro-batches (each rank's subtree locally, the ranks' in rank
  // order after one all-to-all). ZeRO's shards are cut at 1024-element blocks. Costs: no overlap with
  // backward; one copy of the gradients per tree level held; the same bytes on the wire as a ring
  // all-reduce (all-to-all, then all-gather; ZeRO: the all-to-all alone). Refused with side_values, hsdp,
  // and group sizes that are not powers of 2.
  bool deterministic = false;
};

}  // namespace dtrain::parallel
