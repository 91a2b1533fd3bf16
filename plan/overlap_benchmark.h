// How much communication hides behind computation on this machine: the `overlap` of the step model
// (plan/step_model.h), measured by `dtrain bench comm --profile` and by `--strategy auto` when it measures
// the links. Every rank computes matrix products for a while (C seconds alone), all-reduces 1 MiB tensors
// for about as long (A seconds alone), then does both at once, the all-reduces issued first and waited for
// after the products (B seconds); each time is the slowest rank's, the median of three rounds. The overlap is
// (C + A - B) / min(C, A), within 0..1: 1 when the communication costs nothing beside the compute, 0 when
// the two only take turns (as on cores that the communication threads must share with the compute). The
// all-reduces are issued one by one along the products, as gradient buckets are along a backward; each
// phase lasts about 0.2 s; the median of five rounds.
#pragma once

#include "comm/backend.h"

namespace dtrain::plan {

// Collective over `group` (every rank calls it; at least 2 ranks). About a second.
double measure_overlap(comm::Backend& group);

}  // namespace dtrain::plan
