// The planner for the built-in GPT run (docs/planning.md): `dtrain plan` and `dtrain train --strategy
// auto`. It gathers the planner's inputs for the run's options: the model's facts (built on the meta device,
// so any size plans without its memory), its compute profile (measured on this machine and cached, or counted
// from the shape when the profile carries a cluster's compute rate), the links' profile (--profile FILE;
// "builtin"; or measured on the live ranks once and cached), the overlap and the memory budget; then plans.
#pragma once

#include <cstdint>
#include <string>

#include "apps/dtrain/gpt/text_data.h"
#include "apps/dtrain/gpt/train_gpt.h"
#include "comm/backend.h"
#include "plan/planner.h"

namespace dtrain::train {

struct PlanContext {
  int64_t world = 1;
  int64_t ranks_per_host = 1;
  std::string backend = "gloo";  // whose links to plan with
  // The live world (dtrain train, or dtrain plan inside dtrain run): links and overlap are measured on it
  // when no profile is given or cached. nullptr: planning without ranks.
  comm::BackendPtr group;
  // The run's corpus when the caller has it loaded (nullptr: plan_gpt loads o.data to count its bytes).
  const TextCorpus* corpus = nullptr;
};

struct GptPlan {
  plan::Plan plan;
  plan::ModelFacts facts;
};

// Plans o's run over ctx (o.strategy is ignored). ValueError for a missing or malformed profile, links the
// profile lacks, or a budget nothing fits.
GptPlan plan_gpt(const TrainOptions& o, const PlanContext& ctx);

// o with the candidate's layout (strategy, tp, sequence parallel, checkpointing, accumulation, buckets,
// shard size).
void apply_candidate(TrainOptions& o, const plan::Candidate& c);

// `dtrain plan`: world 0 takes the job's (WORLD_SIZE, else 1), ranks_per_host 0 LOCAL_WORLD_SIZE (else the
// world). Prints the table (or --json: one object per candidate per line) and the chosen layout's
// placements. Returns 0.
struct PlanCommandOptions {
  int64_t world = 0;
  int64_t ranks_per_host = 0;
  std::string backend;  // "" the launcher's (DTRAIN_BACKEND) or gloo
  bool json = false;
};
int run_plan(const TrainOptions& o, const PlanCommandOptions& p);

}  // namespace dtrain::train
