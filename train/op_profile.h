// An op-by-op CPU profile of training steps (bench/RESULTS.md, "One process against PyTorch, op by op"):
// every aten op the step's thread runs, its calls and its self time (its own time less the time of the ops it
// calls), summed over the steps after the first two (not the evaluation after the last). `dtrain train`
// installs it when DTRAIN_OP_PROFILE names a file; bench/gpt_ddp.py --op-profile writes the same JSON from
// torch.profiler for PyTorch, and bench/compare_ops.py sets the two side by side.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "train/trainer.h"

namespace dtrain::train {

class OpProfile : public Callback {
 public:
  // Writes {"steps": n, "ops": {name: {"calls": c, "self_us": t}}} to `path` at the end of training (rank 0).
  explicit OpProfile(std::string path) : path_(std::move(path)) {}
  ~OpProfile() override;
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_train_end(Trainer& trainer) override;

  struct Totals {
    int64_t calls = 0;
    int64_t self_ns = 0;
  };

 private:
  void stop();
  std::string path_;
  int64_t steps_ = 0;
  bool recording_ = false;
  at::CallbackHandle handle_ = 0;
};

}  // namespace dtrain::train
