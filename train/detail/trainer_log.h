// Trainer::Log, the Trainer's view of the run on rank 0 (its lines, progress bar and metrics file), and the
// bar's helpers; included by train/trainer.cpp only.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/trainer.h"

namespace dtrain::train {

namespace detail {

// A progress bar on rank 0: DTRAIN_PROGRESS=1 (set by `dtrain run` when it writes to a terminal; its line
// relay shows the bar in place) or, without it, a terminal on stdout; never with DTRAIN_PROGRESS=0.
inline bool progress_bar() {
  if (const char* v = std::getenv("DTRAIN_PROGRESS")) return std::string(v) == "1";
  return ::isatty(1) == 1;
}

inline std::string eta_text(double secs) {
  if (!(secs >= 0) || !std::isfinite(secs)) return "?";
  const long s = std::lround(secs);
  return s >= 3600 ? str_cat(s / 3600, "h", (s % 3600) / 60, "m") : str_cat(s / 60, "m", s % 60, "s");
}

}  // namespace detail

// Rank 0's view of the run: a line every log_every steps (on a terminal, also a progress bar redrawn every
// step), and with `metrics` one JSON object per step, written and flushed as it comes.
//
// The bar's loss is recent: besides the logged steps, the global loss is gathered every kBarPeriod or so.
// Which steps gather it must be the same on every rank (it is a collective), so it is never decided by a
// rank's own clock: rank 0 puts two numbers into the loss's all-reduce itself (whether it shows a bar, and
// its seconds per step so far), and every rank derives the next bar step from the reduced values alike. Under
// dp the loss rides with the gradients on every step, and the bar shows the current step's.
class Trainer::Log {
 public:
  Log(const TrainerOptions& o, bool lead, int64_t first_step)
      : o_(o),
        lead_(lead),
        first_step_(first_step),
        t0_(std::chrono::steady_clock::now()),
        bar_(lead && detail::progress_bar()) {
    if (lead_ && !o.metrics.empty()) {
      // a resumed run (an elastic restart included) continues the file; a new one starts it afresh
      metrics_.open(o.metrics, first_step > 1 ? std::ios::app : std::ios::trunc);
      if (!metrics_) {
        throw ValueError(str_cat("train: metrics file ", o.metrics,
                                 " cannot be written. Name a file in a folder that exists and is writable."));
      }
    }
  }
  static constexpr double kBarPeriod = 0.5;  // seconds between the bar's gathered losses, about

  bool wants(int64_t step) const {
    return !o_.metrics.empty() || step == first_step_ || step % o_.log_every == 0 || step == o_.steps ||
           (bar_agreed_ && step >= next_bar_step_);
  }
  // What rank 0 adds to step `step`'s loss all-reduce (zeros elsewhere): {shows a bar, seconds per step}.
  std::array<double, 2> lead_values(int64_t step) const {
    if (!lead_) return {0, 0};
    const int64_t done = step - first_step_;  // steps finished before this one
    return {bar_ ? 1.0 : 0.0, done > 0 ? seconds() / static_cast<double>(done) : 0.0};
  }
  // Every rank, after step `step`'s loss all-reduce, with the reduced lead_values: the next bar step.
  void agree(int64_t step, double bar, double step_seconds) {
    bar_agreed_ = bar > 0.5;
    const double every = step_seconds > 0 ? std::floor(kBarPeriod / step_seconds) : 1.0;
    next_bar_step_ = step + static_cast<int64_t>(std::clamp(every, 1.0, 100000.0));
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  void step(const StepInfo& s, const std::vector<double>& rss, const std::vector<double>& tensor_peak,
            double loss_scale) {
    if (!lead_) return;
    const double rate = static_cast<double>((s.step - first_step_ + 1) * o_.batch * o_.tokens_per_sample) /
                        std::max(s.seconds, 1e-9);
    if (!std::isnan(s.loss)) {
      shown_loss_ = s.loss;
      shown_step_ = s.step;
    }
    if (metrics_.is_open()) {
      nlohmann::json j{
          {"step", s.step}, {"loss", s.loss}, {"lr", s.lr}, {"elapsed_s", s.seconds}, {"tokens_per_s", rate}};
      if (s.grad_norm >= 0) j["grad_norm"] = s.grad_norm;
      if (o_.precision == "fp16") j["loss_scale"] = loss_scale;
      if (s.skipped) j["skipped"] = true;
      j["comm_wait_s"] = s.comm_wait_s;
      if (!rss.empty()) j["rss_mib"] = rss;
      if (!tensor_peak.empty()) j["tensor_peak_mib"] = tensor_peak;
      metrics_ << j.dump() << "\n";
      metrics_.flush();
    }
    const double per_step = s.seconds / static_cast<double>(s.step - first_step_ + 1);
    const double eta = per_step * static_cast<double>(o_.steps - s.step);
    if (s.step == first_step_ || s.step % o_.log_every == 0 || s.step == o_.steps) {
      if (bar_) std::printf("\033[K");
      std::printf("step %5ld  loss %.4f  lr %.2e  %.0f %s/s%s%s\n", static_cast<long>(s.step), s.loss, s.lr,
                  rate, unit(), s.grad_norm >= 0 ? str_cat("  grad norm ", s.grad_norm).c_str() : "",
                  s.skipped ? "  (skipped: inf or nan)" : "");
    }
    if (bar_ && s.step < o_.steps) {  // on a terminal: a bar under the lines, redrawn in place
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * s.step / std::max<int64_t>(1, o_.steps));
      // (the loss of an earlier step says which)
      const std::string of =
          shown_step_ == s.step ? "" : str_cat(" (step ", static_cast<long>(shown_step_), ")");
      std::printf("\033[K[%s%s] step %ld/%ld  loss %.4f%s  %.0f %s/s  ETA %s\r",
                  std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                  static_cast<long>(s.step), static_cast<long>(o_.steps), shown_loss_, of.c_str(), rate,
                  unit(), detail::eta_text(eta).c_str());
    }
    std::fflush(stdout);
  }
  void evaluation(int64_t step, double loss) {
    if (!lead_) return;
    if (metrics_.is_open()) {
      metrics_ << nlohmann::json{{"step", step}, {"val_loss", loss}}.dump() << "\n";
      metrics_.flush();
    }
    if (bar_) std::printf("\033[K");
    std::printf("step %5ld  validation loss %.4f\n", static_cast<long>(step), loss);
    std::fflush(stdout);
  }

 private:
  const char* unit() const { return o_.tokens_per_sample > 1 ? "tokens" : "samples"; }
  const TrainerOptions& o_;
  bool lead_;
  int64_t first_step_;
  std::chrono::steady_clock::time_point t0_;
  bool bar_;
  double shown_loss_ = std::numeric_limits<double>::quiet_NaN();
  int64_t shown_step_ = 0;     // the step shown_loss_ belongs to
  bool bar_agreed_ = false;    // every rank: rank 0 shows a bar (from the reduced lead_values)
  int64_t next_bar_step_ = 0;  // every rank: the next step that gathers the loss for the bar
  std::ofstream metrics_;
};

}  // namespace dtrain::train
