// The Trainer's learning-rate schedule (TrainerOptions: lr, warmup, warmup_type, warmup_min_lr, lr_schedule,
// min_lr, steps): a warmup (linear from 0, or DeepSpeed's WarmupLR, linear or log from warmup_min_lr), then
// constant, linear (DeepSpeed's WarmupDecayLR) or cosine down to min_lr (lr / 10 when unset). Pure.
#pragma once

#include <cstdint>

#include "train/trainer.h"

namespace dtrain::train {

// The learning rate of step `step` (1-based) under `o`'s schedule.
double scheduled_lr(const TrainerOptions& o, int64_t step);

}  // namespace dtrain::train
