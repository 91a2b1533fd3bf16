// DeepSpeed ZeRO stages 1 and 2; see zero.h.
#include "parallel/zero.h"

#include "core/error.h"
#include "core/log.h"

namespace dtrain::parallel {

namespace {

int checked_stage(int stage) {
  if (stage != 1 && stage != 2) {
    throw ValueError(str_cat("zero: stage ", stage,
                             " is not built here. Use stage 1 (optimizer state sharded) or 2 "
                             "(and gradients); stage 3 (parameters too) is not built yet."));
  }
  return stage;
}

}  // namespace

Zero::Zero(torch::nn::Module& module, comm::BackendPtr group, int stage, const OptimizerFactory& make,
           DataParallelOptions opts)
    : stage_(checked_stage(stage)), dp_(module, std::move(group), opts, stage) {
  optimizer_ = make(dp_.shard_parameters());
  if (!optimizer_) throw ValueError("zero: the optimizer factory returned no optimizer.");
}

void Zero::zero_grad() { optimizer_->zero_grad(); }

void Zero::step() {
  optimizer_->step();
  dp_.gather_parameters();
}

}  // namespace dtrain::parallel
