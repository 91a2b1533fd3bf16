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
#include "plan/cluster_profile.h"
#include "plan/measure_compute.h"

namespace dtrain::plan {

// Collective over `group` (every rank calls it; at least 2 ranks). About a second.
double measure_overlap(comm::Backend& group);

// What a blocking collective costs inside a real step beyond its alpha-beta time (the ranks' drift each one
// makes the faster rank wait out, the communication threads' turns on shared cores): the module's
// tensor-parallel split run on `group`'s real collectives against the same run on a rehearsal group, the
// difference less the calls' alpha-beta time, per call (>= 0; the slowest rank's): the median of 7 rounds of
// one pass on each, in turn. Collective over `group` (its size is the tp degree); 16 forward and backward
// passes of `micro_batch` samples in all.
double measure_blocking_penalty(const ProfileTarget& target, const comm::BackendPtr& group,
                                int64_t micro_batch, const ClusterProfile& links);

}  // namespace dtrain::plan
