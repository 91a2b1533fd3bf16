// Rehearsed steps of the data-parallel strategies (dp, zero1, zero2, zero3) in this process: the strategy's
// own code (parallel::parallelize) over a rehearsal group (comm/rehearsal.h) of the data-parallel size, so
// that its collectives are instant and everything else a rank does in a step is real: bucket copies, ZeRO's
// flat shards, ZeRO-3's on-demand gathers through the dispatcher, its buffers, the optimizer over the shards.
// The step model (plan/step_model.h) takes from each what its formulas do not cover: the time beyond
// forward, backward and optimizer, and the bytes beyond the model state, accumulated gradients, gathered
// unit and activations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/compute_profile.h"
#include "plan/measure_compute.h"

namespace dtrain::plan {

// One warm-up step of each case, then rounds of one timed step of each, the cases that differ only in
// accumulation on one module in turn (two rounds at least, more while they take under 0.6 s, six at most);
// each case's fastest step is kept. Appended to out.strategies.
void rehearse_strategies(const ProfileTarget& target, const std::vector<RehearsalCase>& cases,
                         ComputeProfile& out);

}  // namespace dtrain::plan
