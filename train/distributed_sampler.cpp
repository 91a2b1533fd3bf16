// DistributedSampler; see distributed_sampler.h.
#include "train/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>

#include "core/balanced_split.h"
#include "core/error.h"

namespace dtrain::train {

DistributedSampler::DistributedSampler(int64_t samples, int64_t batch, uint64_t seed)
    : samples_(samples), batch_(batch), seed_(seed) {
  if (samples < 1 || batch < 1) {
    throw ValueError(str_cat("DistributedSampler: ", samples, " samples and batch ", batch,
                             " must both be at least 1 (a dataset too small for one sample?)."));
  }
}

at::Tensor DistributedSampler::order(int64_t epoch) const {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)));
  return at::randperm(samples_, gen, at::kLong);
}

int64_t DistributedSampler::epoch_of(int64_t step) const { return (step - 1) * batch_ / samples_; }

at::Tensor DistributedSampler::step_indices(int64_t step) const {
  if (step < 1) throw ValueError(str_cat("DistributedSampler: step ", step, " must be 1 or more."));
  at::Tensor out = at::empty({batch_}, at::kLong);
  int64_t pos = (step - 1) * batch_, filled = 0;
  while (filled < batch_) {
    const int64_t epoch = pos / samples_, at_ = pos % samples_;
    const int64_t take = std::min(batch_ - filled, samples_ - at_);
    out.narrow(0, filled, take).copy_(order(epoch).narrow(0, at_, take));
    filled += take;
    pos += take;
  }
  return out;
}

at::Tensor DistributedSampler::rank_indices(int64_t step, int64_t rank, int64_t ranks) const {
  const Range r = balanced_part(batch_, ranks, rank);
  return step_indices(step).narrow(0, r.start, r.count);
}

}  // namespace dtrain::train
