// DistributedSampler: which samples each training step takes, and which of them each data-parallel rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dtrain::train {

// Which samples of a dataset of `samples` each step takes: epochs of every sample once, in an order drawn
// from (seed, epoch); step s (1-based) takes the next `batch` of the sequence of epochs, and data-parallel
// rank r of n the rows balanced_part(batch, n, r) of them. Disjoint across ranks, every sample once
// per epoch (a step that crosses an epoch's end takes the rest of it and the start of the next),
// deterministic, and a function of the step: a run resumed at any step, mid-epoch included, continues the
// same sequence.
class DistributedSampler {
 public:
  DistributedSampler(int64_t samples, int64_t batch, uint64_t seed);
  // The global batch of step `step`: sample indices, int64 [batch].
  at::Tensor step_indices(int64_t step) const;
  // This rank's part of it.
  at::Tensor rank_indices(int64_t step, int64_t rank, int64_t ranks) const;
  int64_t epoch_of(int64_t step) const;  // 0-based
  int64_t samples() const { return samples_; }

 private:
  at::Tensor order(int64_t epoch) const;
  int64_t samples_, batch_;
  uint64_t seed_;
};

}  // namespace dtrain::train
