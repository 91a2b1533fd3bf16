// apply_plan(); see apply_plan.h.
#include "train/apply_plan.h"

#include "core/error.h"

namespace dtrain::train {

void apply_plan(TrainerOptions& o, const plan::Candidate& c, const plan::ProfileTarget& target) {
  if (c.tp > 1 && !target.tp_plan) {
    throw ValueError(
        str_cat("apply_plan: candidate ", c.name(), " splits over tp ", c.tp,
                " but the target has no tensor-parallel plan (ProfileTarget::tp_plan). Plan with "
                "the same target the candidate came from."));
  }
  if (c.sequence_parallel && !target.sequence_parallel) {
    throw ValueError(str_cat("apply_plan: candidate ", c.name(),
                             " uses sequence parallel, which the target does not say its tp plan supports "
                             "(ProfileTarget::sequence_parallel). Plan with the same target."));
  }
  if (c.checkpoint_activations && target.checkpoint_patterns.empty()) {
    throw ValueError(str_cat("apply_plan: candidate ", c.name(),
                             " checkpoints activations but the target names no blocks to recompute "
                             "(ProfileTarget::checkpoint_patterns). Plan with the same target."));
  }
  o.strategy = c.strategy;
  o.tp = c.tp;
  o.tp_plan = c.tp > 1 ? target.tp_plan(c.sequence_parallel) : parallel::TensorParallelPlan{};
  o.activation_checkpointing =
      c.checkpoint_activations ? target.checkpoint_patterns : std::vector<std::string>{};
  o.accumulation = c.accumulation;
  o.bucket_bytes = c.bucket_bytes;
  o.shard_size = c.shard_size;
  o.mesh_order = c.mesh_order;
}

}  // namespace dtrain::train
