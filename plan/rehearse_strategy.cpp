// Rehearsed strategy steps; see rehearse_strategy.h.
#include "plan/rehearse_strategy.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>

#include "comm/comm_log.h"
#include "comm/rehearsal.h"
#include "core/error.h"
#include "dispatch/tensor_memory.h"
#include "parallel/parallelize.h"

namespace dtrain::plan {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One step; the bytes tensors peaked at over its forward and backward passes, and over its optimizer step.
struct Peaks {
  int64_t passes = 0, step = 0;
};
Peaks one_step(const ProfileTarget& t, torch::nn::Module& m, parallel::Parallelized& par,
               const RehearsalCase& c) {
  Peaks p;
  dispatch::reset_tensor_peak();
  par.zero_grad();
  for (int64_t k = 0; k < c.accumulation; ++k) {
    par.set_requires_gradient_sync(k == c.accumulation - 1);
    (t.loss(m, c.micro_batch) / static_cast<double>(c.accumulation)).backward();
  }
  p.passes = dispatch::tensor_bytes_peak();
  dispatch::reset_tensor_peak();
  par.step();
  p.step = dispatch::tensor_bytes_peak();
  return p;
}

}  // namespace

void rehearse_strategies(const ProfileTarget& t, const std::vector<RehearsalCase>& cases,
                         ComputeProfile& out) {
  dispatch::install_tensor_memory_counter();
  for (const RehearsalCase& c : cases) {
    const int64_t before = dispatch::tensor_bytes_live();
    std::shared_ptr<torch::nn::Module> m = t.build();
    parallel::ParallelConfig pc;
    pc.strategy = c.strategy;
    pc.reduction.bucket_bytes = c.bucket_bytes;
    if (c.checkpoint) pc.activation_checkpointing = t.checkpoint_patterns;
    auto par = parallel::parallelize(
        *m, comm::rehearsal_group(static_cast<int>(c.group)), pc, [](std::vector<at::Tensor> params) {
          return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-4));
        });
    comm::NotLogged quiet;
    auto t0 = Clock::now();
    one_step(t, *m, *par, c);  // warm-up: the optimizer's state allocated
    const int timed = since(t0) > 0.5 ? 1 : 2;
    std::vector<double> s;
    Peaks most;
    for (int i = 0; i < timed; ++i) {
      t0 = Clock::now();
      const Peaks p = one_step(t, *m, *par, c);
      s.push_back(since(t0));
      most.passes = std::max(most.passes, p.passes);
      most.step = std::max(most.step, p.step);
    }
    StrategyPoint p;
    p.strategy = c.strategy;
    p.group = c.group;
    p.bucket_bytes = c.bucket_bytes;
    p.checkpoint = c.checkpoint;
    p.accumulation = c.accumulation;
    p.micro_batch = c.micro_batch;
    p.step_s = *std::min_element(s.begin(), s.end());
    p.peak_bytes = most.passes - before;
    p.step_peak_bytes = most.step - before;
    out.strategies.push_back(p);
  }
}

}  // namespace dtrain::plan
