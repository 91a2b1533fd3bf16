// How a plan is shown: the table `dtrain plan` prints (and `dtrain train --strategy auto --verbose`), one
// JSON object per candidate (`dtrain plan --json`), and the chosen layout's placement of every parameter per
// mesh axis in DTensor notation (the notation of `dtrain explain`).
#pragma once

#include <string>

#include "plan/planner.h"

namespace dtrain::plan {

// The notes, then one row per candidate: rank, name, predicted step (ms), predicted peak (MiB), fits, and
// the reason; the chosen one marked.
std::string plan_table(const Plan& plan);

// One line of JSON: strategy, tp, sequence_parallel, checkpoint_activations, micro_batch, accumulation,
// bucket_bytes, shard_size, predicted_step_s, predicted_peak_mib, fits, chosen, rank, reason, flags, and the
// parts (compute_s, optimizer_s, comm_s, exposed_comm_s, memory_mib: {part: MiB}, name).
std::string candidate_json(const Candidate& c);
// The candidate candidate_json wrote (every field it writes but the name). ValueError naming the text when it
// is not such an object.
Candidate candidate_from_json(const std::string& text);

// "mesh [dp=2, tp=2]" and one line per parameter: "  h0.attn.q.weight  dp: Shard(0)  tp: Shard(0)".
std::string placements(const Candidate& c, const ModelFacts& facts, int64_t world);

}  // namespace dtrain::plan
