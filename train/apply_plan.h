// Runs a planner's candidate (plan/plan_module.h) with the Trainer: a user's own module planned from C++.
//   plan::ModulePlanRequest r;  r.target = {build, loss, {"block*"}, tp_plan, "my model"};  r.batch = 32; ...
//   const plan::ModulePlan p = plan::plan_module(r);             // collective over r.group
//   TrainerOptions o;  o.batch = 32;  apply_plan(o, p.plan.candidates[p.plan.chosen], r.target);
//   Trainer trainer(*model, loss, batches, o, world);            // the chosen layout
#pragma once

#include "plan/candidate.h"
#include "plan/measure_compute.h"
#include "train/trainer.h"

namespace dtrain::train {

// `o` with `c`'s layout: strategy, tp and its plan (target.tp_plan, with c's sequence parallel), activation
// checkpointing (target.checkpoint_patterns when c checkpoints), accumulation, buckets, shard size and mesh
// order. ValueError when c needs what the target lacks (a tp plan, sequence parallel, checkpoint patterns).
void apply_plan(TrainerOptions& o, const plan::Candidate& c, const plan::ProfileTarget& target);

}  // namespace dtrain::train
