// A DeepSpeed JSON config (DeepSpeed's "Configuration JSON") read as `dtrain train` settings: the batch
// sizes, gradient accumulation, the optimizer block (Adam, AdamW), the scheduler block (WarmupLR,
// WarmupDecayLR), fp16 and bf16, gradient clipping, zero_optimization (the stage and the bucket sizes, which
// DeepSpeed counts in elements) and steps_per_print, each mapped onto apps/dtrain/gpt/config.h's keys, so the
// same checks apply. A key dtrain does not support is an error naming it; "auto" (Hugging Face's placeholder)
// keeps dtrain's value.
#pragma once

#include <string>

#include "apps/dtrain/gpt/train_gpt.h"

namespace dtrain::train {

// Applies the DeepSpeed config `path` to `o`. Keys whose behaviour dtrain fixes (overlap_comm, ...) are
// accepted, and what dtrain does instead is added to o.config_notes (printed at the start). ValueError naming
// the file, the key and why.
void apply_deepspeed_config(TrainOptions& o, const std::string& path);

}  // namespace dtrain::train
