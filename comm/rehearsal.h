// A rehearsal group: `size` ranks played by this one process as group rank `rank`, for measuring what one
// rank of a layout computes and holds without the other ranks (plan/measure_compute.h measures the
// tensor-parallel splits this way). Every collective completes at once, doing this rank's share: all_gather
// repeats this rank's input in every slot, reduce_scatter keeps this rank's chunk unreduced, all_reduce,
// broadcast and barrier leave the data as it is, all_to_all moves chunks as if every rank had sent this
// rank's. Shapes, allocations and compute are a real rank's; the values are not (they never leave the
// measurement). Point-to-point ops are refused. It moves nothing, so it has no agreement check, store or
// timeout to honour; CommLog records its collectives as any group's.
#pragma once

#include "comm/backend.h"

namespace dtrain::comm {

// ValueError unless 1 <= size and 0 <= rank < size.
std::shared_ptr<Backend> rehearsal_group(int size, int rank = 0);

}  // namespace dtrain::comm
