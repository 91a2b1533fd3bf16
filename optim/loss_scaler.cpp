// The fp16 loss scaler; see loss_scaler.h.
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dtrain::optim {

void LossScalerOptions::validate() const {
  auto positive_finite = [](const char* name, double v) {
    if (!(v > 0) || !std::isfinite(v)) {
      throw ValueError(str_cat("loss scaler: ", name, " = ", v, " must be a positive finite number."));
    }
  };
  positive_finite("initial_scale", initial_scale);
  positive_finite("min_scale", min_scale);
  if (!dynamic) return;
  if (window < 1) throw ValueError(str_cat("loss scaler: window = ", window, " must be at least 1 step."));
  if (hysteresis < 1) {
    throw ValueError(str_cat("loss scaler: hysteresis = ", hysteresis,
                             " must be at least 1 (1: the scale halves at every overflow)."));
  }
  if (!(factor > 1) || !std::isfinite(factor)) {
    throw ValueError(str_cat("loss scaler: factor = ", factor, " must be a finite number above 1."));
  }
  if (min_scale > initial_scale) {
    throw ValueError(str_cat("loss scaler: min_scale = ", min_scale, " is above initial_scale = ",
                             initial_scale, ". Lower min_scale or raise initial_scale."));
  }
}

LossScaler::LossScaler(LossScalerOptions options)
    : opts_(options), scale_(options.initial_scale), hysteresis_left_(options.hysteresis) {
  opts_.validate();
}

bool LossScaler::update(bool overflow) {
  if (!opts_.dynamic) {
    ++iter_;
    skipped_ += overflow ? 1 : 0;
    return overflow;
  }
  if (overflow) {
    if (hysteresis_left_ <= 1) {
      if (scale_ <= opts_.min_scale) {
        throw ValueError(
            str_cat("loss scaler: the gradients overflowed at the minimum loss scale ", opts_.min_scale,
                    " (step ", iter_, ", ", skipped_,
                    " steps skipped so far): every later step "
                    "would be skipped. Lower min_scale, use bf16, or look for the inf/nan at its "
                    "source (a learning rate too high, bad data)."));
      }
      scale_ = std::max(scale_ / opts_.factor, opts_.min_scale);
    } else {
      --hysteresis_left_;
    }
    last_overflow_ = iter_;
    ++skipped_;
  } else {
    if (opts_.consecutive_hysteresis) hysteresis_left_ = opts_.hysteresis;
    const int64_t clean = iter_ - last_overflow_ - 1;  // clean steps before this one since the last overflow
    if (clean > 0 && clean % opts_.window == 0) {
      hysteresis_left_ = opts_.hysteresis;
      scale_ *= opts_.factor;
    }
  }
  ++iter_;
  return overflow;
}

std::string LossScaler::to_string() const {
  if (!opts_.dynamic) return str_cat("loss scale ", scale_, " (static)");
  return str_cat("loss scale ", scale_, " (hysteresis ", hysteresis_left_, " of ", opts_.hysteresis, ", ",
                 skipped_, " steps skipped of ", iter_, ")");
}

void LossScaler::restore(const State& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale) || s.steps < 0 || s.skipped < 0 || s.skipped > s.steps ||
      s.hysteresis_left < 0 || s.last_overflow < -1 || s.last_overflow >= s.steps) {
    throw ValueError(str_cat("loss scaler: a saved state (scale ", s.scale, ", steps ", s.steps, ", skipped ",
                             s.skipped, ", hysteresis left ", s.hysteresis_left, ", last overflow ",
                             s.last_overflow, ") is not one a scaler can be in. The checkpoint is damaged."));
  }
  scale_ = s.scale;
  iter_ = s.steps;
  last_overflow_ = s.last_overflow;
  hysteresis_left_ = s.hysteresis_left;
  skipped_ = s.skipped;
}

}  // namespace dtrain::optim
