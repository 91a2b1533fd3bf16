// The learning-rate schedule; see schedule.h.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace dtrain::train {

double scheduled_lr(const TrainerOptions& o, int64_t step) {
  if (step <= o.warmup) {
    if (o.warmup_min_lr < 0 && o.warmup_type == "linear") {
      return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup);
    }
    // DeepSpeed's WarmupLR: its iteration i = step - 1 goes from warmup_min_lr (i = 0) towards lr
    const double i = static_cast<double>(step - 1), w = static_cast<double>(o.warmup);
    const double gamma = o.warmup_type == "log" ? (w > 1 ? std::log(i + 1) / std::log(w) : 1.0) : i / w;
    const double from = std::max(0.0, o.warmup_min_lr);
    return from + (o.lr - from) * gamma;
  }
  if (o.lr_schedule == "constant") return o.lr;
  const double floor = o.min_lr < 0 ? o.lr / 10 : o.min_lr;
  const int64_t span = o.steps - o.warmup;  // steps warmup+1 .. steps: from lr down to floor
  const double t = span <= 1 ? 1.0 : static_cast<double>(step - o.warmup - 1) / static_cast<double>(span - 1);
  if (o.lr_schedule == "linear") {  // DeepSpeed's WarmupDecayLR: its iteration step - 1, over total steps
    return floor + (o.lr - floor) * static_cast<double>(std::max<int64_t>(0, o.steps - step + 1)) /
                       static_cast<double>(std::max<int64_t>(1, span));
  }
  return floor + (o.lr - floor) * 0.5 * (1 + std::cos(M_PI * std::min(1.0, t)));
}

}  // namespace dtrain::train
