// The agreement check's switches and checker, for the engines and the benchmark of its cost
// (docs/architecture.md, "Ranks agree on every collective"). Private to comm/ and bench/.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/work.h"

namespace dtrain::comm {

// Turns the agreement check off (or back on) for this process. For measuring what the check costs
// (bench/agreement_cost.cpp) only: with it off, ranks that disagree get the engine's behaviour back (an
// abort, a wrong result). On by default.
void set_agreement_check(bool on);
bool agreement_check();

// The agreement check, for the engines: `all` holds every group rank's OpInfo::signature (kSignatureFields
// int64 each, in group-rank order; `global_ranks[g]` is group rank g's global rank); throws ValueError naming
// the ranks that differ and how.
void check_signatures(const OpInfo& info, const int64_t* all, const std::vector<int>& global_ranks);

}  // namespace dtrain::comm
