// Global-norm clipping; see clip.h.
#include "optim/clip.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>

#include "comm/comm_log.h"
#include "core/error.h"

namespace dtrain::optim {

double clip_grad_norm(parallel::Parallelized& par, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw ValueError(str_cat("clip_grad_norm: max_norm = ", max_norm, " must be a positive finite number."));
  }
  par.finish_gradients();
  const auto parts = par.gradient_parts();
  at::NoGradGuard no_grad;
  at::Tensor sum = at::zeros({1}, at::kDouble);
  if (par.deterministic()) {
    // bitwise the same at any world size: under dp every rank holds the whole gradient (summed here in
    // parameter order, no collective); under ZeRO the sums of fixed blocks, gathered in a fixed order
    if (par.strategy() == parallel::Strategy::kDataParallel) {
      for (const auto& p : parts) {
        if (p.grad.defined()) sum += p.grad.detach().to(at::kDouble).pow(2).sum();
      }
    } else {
      sum = par.gradient_block_squares().sum().view({1});
    }
  } else {
    for (const auto& p : parts) {
      if (!p.grad.defined()) continue;
      sum += p.grad.detach().to(at::kDouble).pow(2).sum() / static_cast<double>(p.copies);
    }
    comm::CommCause cause("clip_grad_norm");
    par.world()->all_reduce(sum)->wait();
  }
  const double norm = std::sqrt(sum.item<double>());
  const double coef = std::min(1.0, max_norm / (norm + 1e-6));
  if (coef < 1.0) {
    for (const auto& p : parts) {
      if (p.grad.defined()) p.grad.mul_(coef);  // (a run of a ZeRO shard: a view, scaled in place)
    }
  }
  return norm;
}

}  // namespace dtrain::optim
