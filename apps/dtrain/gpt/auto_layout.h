// `dtrain train --strategy auto`: the planner's choice (apps/dtrain/gpt/plan_gpt.h) applied to the run's
// options, printed with its prediction (and with --verbose the whole table); with --auto-confirm K, the top K
// candidates first trained for a few steps each, and the fastest measured kept, predicted against measured
// printed for each.
#pragma once

#include "apps/dtrain/gpt/text_data.h"
#include "apps/dtrain/gpt/train_gpt.h"
#include "comm/backend.h"

namespace dtrain::train {

// Collective over `world`: every rank plans; rank 0's choice is every rank's.
// `corpus` is the run's (loaded once: the planner counts its bytes, --auto-confirm trains on it).
void choose_layout(TrainOptions& o, const comm::BackendPtr& world, const TextCorpus& corpus);

}  // namespace dtrain::train
