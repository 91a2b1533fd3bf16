// The ranks of a group agreeing on what rank 0 has (share_op_times, share_choice): every rank solves the same
// problem and follows the same plan.
#pragma once

#include <string>
#include <vector>

#include "comm/backend.h"

namespace dtrain::plan::detail {

// Replaces `values` with rank 0's (a broadcast), after checking that every rank of `group` holds as many.
// ValueError otherwise, naming the ranks and their counts: `what` says what the values count ("ops of the
// step"), `fix` what to do.
void take_rank0_values(std::vector<double>& values, comm::Backend& group, const std::string& caller,
                       const std::string& what, const std::string& fix);

}  // namespace dtrain::plan::detail
