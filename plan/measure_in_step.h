// Measures InStepCosts (plan/in_step_costs.h) on the live ranks: each family of a model's collectives run in
// real steps on the real group, against the same steps on a rehearsal group (comm/rehearsal.h, collectives
// instant), a step of each in turn so that the machine's drift over the rounds falls on both; the median
// difference, less what the step model prices for those calls (plan/step_model.h, without in-step costs),
// per call. The families and sizes:
//   tp, tp sp   the largest tensor-parallel degree's split (with sequence parallel where the target has it),
//               a forward and backward of a micro-batch;
//   dp, zero3   over the whole world at tp 1, a whole step (forward, backward, optimizer) at accumulation 1:
//               dp with the run's buckets (its figure serves zero1 and zero2), zero3 at each unit size the
//               planner tries;
// each at two micro-batch sizes, the largest a candidate of it uses and an eighth of that; dp and zero3 also
// at accumulation 2 at the smaller size, for what each further micro-batch adds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "plan/cluster_profile.h"
#include "plan/compute_model.h"
#include "plan/in_step_costs.h"
#include "plan/measure_compute.h"
#include "plan/model_facts.h"
#include "plan/step_model.h"

namespace dtrain::plan {

struct InStepRequest {
  const ProfileTarget* target = nullptr;
  comm::BackendPtr world;  // every rank of the plan, on one host or several
  const ModelFacts* facts = nullptr;
  const ComputeModel* compute = nullptr;
  ClusterProfile links;  // the links (their in-step costs are not used)
  Topology topo;
  double overlap = 0;
  int64_t batch = 16;               // the global batch
  std::vector<int64_t> tp_degrees;  // the tensor-parallel degrees planned (the largest is measured)
  int64_t bucket_bytes = 0;         // dp's buckets (0: the default)
  int rounds = 5;                   // the fewest pairs of steps per point, after one warm-up pair
  int max_rounds = 15;              // the most: more while the point has taken under point_s
  double point_s = 1.5;
};

// Collective over r.world (2 ranks or more); every rank returns the same figures (each time is the slowest
// rank's).
InStepCosts measure_in_step(const InStepRequest& r);

// The largest of every rank's `seconds` over `group` (collective).
double slowest_seconds(comm::Backend& group, double seconds);

}  // namespace dtrain::plan
