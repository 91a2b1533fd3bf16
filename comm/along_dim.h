// The uneven collectives along one dim of a tensor, the one home for them: each rank holds lens[r] rows of a
// dim (any split, e.g. core/balanced_split.h's), and the collective moves whole rows. Used by DTensor's
// redistribution (tensor/redistribute.cpp) and by tensor parallelism's regions (parallel/tp_ops.cpp). The
// tensors travel flat with the dim moved to the front, so each rank's rows are one contiguous run. Blocking;
// the caller records the communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace dtrain::comm {

// Every rank's `x` (lens[r] rows along `dim` on rank r, the other dims alike) concatenated along `dim` in
// group-rank order. `who` names the caller in the error when this rank's rows are not lens[group_rank].
at::Tensor all_gather_along(const BackendPtr& group, const at::Tensor& x, int64_t dim,
                            const std::vector<int64_t>& lens, const std::string& who);

// This rank's rows (lens[group_rank] along `dim`, at the offset of the lens before it) of the reduction
// (`op`) over the ranks of `x`, which holds every row (sum of lens) along `dim`.
at::Tensor reduce_scatter_along(const BackendPtr& group, const at::Tensor& x, int64_t dim,
                                const std::vector<int64_t>& lens, ReduceOp op, const std::string& who);

}  // namespace dtrain::comm
