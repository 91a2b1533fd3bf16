// Global-norm gradient clipping over every shard and mesh axis (DESIGN §5), the distributed counterpart of
// torch::nn::utils::clip_grad_norm_: each rank sums the squares of the gradients it steps on, divided by how
// many ranks hold the same values (parallel::Parallelized::gradient_parts), and one all-reduce of that single
// number gives the whole gradient's norm. No gradient is gathered. The same coefficient as libtorch's,
// max_norm / (norm + 1e-6) capped at 1, then scales every rank's gradients. In deterministic mode the norm is
// bitwise the same at any world size: dp sums its whole gradient locally (no collective), ZeRO gathers the
// squares' sums of fixed 1024-element blocks (8 bytes per block) and adds them in a fixed order.
#pragma once

#include "parallel/parallelize.h"

namespace dtrain::optim {

// Clips the gradients of `par`'s last backward to global L2 norm `max_norm` and returns the norm before
// clipping (the same on every rank). Collective over the world. ValueError for max_norm <= 0.
double clip_grad_norm(parallel::Parallelized& par, double max_norm);

}  // namespace dtrain::optim
