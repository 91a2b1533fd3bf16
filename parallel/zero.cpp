// DeepSpeed ZeRO stages 1 and 2; see zero.h.
#include "parallel/zero.h"

#include "core/error.h"
#include "core/log.h"

namespace dtrain::parallel {

namespace {

int checked_stage(int stage) {
  if (stage < 1 || stage > 3) {
    throw ValueError(str_cat("zero: stage ", stage,
                             " does not exist. Use stage 1 (optimizer state sharded), 2 (and gradients) or 3 "
                             "(and parameters)."));
  }
  return stage;
}

}  // namespace

Zero::Zero(torch::nn::Module& module, comm::BackendPtr group, int stage, const OptimizerFactory& make,
           DataParallelOptions opts, comm::BackendPtr replicate)
    : stage_(checked_stage(stage)), dp_(module, std::move(group), opts, stage, std::move(replicate)) {
  optimizer_ = make(dp_.shard_parameters());
  if (!optimizer_) throw ValueError("zero: the optimizer factory returned no optimizer.");
}

void Zero::zero_grad() { optimizer_->zero_grad(); }

void Zero::step() {
  optimizer_->step();
  dp_.gather_parameters();
}

}  // namespace dtrain::parallel
