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
  // the cases that differ only in accumulation share a module and run in turn, a step of each per round, so
  // that the machine's drift falls on all of them alike (the step model takes their difference)
  std::vector<bool> done(cases.size(), false);
  for (size_t i = 0; i < cases.size(); ++i) {
    if (done[i]) continue;
    std::vector<size_t> group;
    for (size_t j = i; j < cases.size(); ++j) {
      const RehearsalCase &a = cases[i], &b = cases[j];
      if (!done[j] && a.strategy == b.strategy && a.group == b.group && a.bucket_bytes == b.bucket_bytes &&
          a.checkpoint == b.checkpoint && a.micro_batch == b.micro_batch) {
        group.push_back(j);
        done[j] = true;
      }
    }
    const RehearsalCase& c0 = cases[i];
    const int64_t before = dispatch::tensor_bytes_live();
    std::shared_ptr<torch::nn::Module> m = t.build();
    parallel::ParallelConfig pc;
    pc.strategy = c0.strategy;
    pc.reduction.bucket_bytes = c0.bucket_bytes;
    if (c0.checkpoint) pc.activation_checkpointing = t.checkpoint_patterns;
    auto par = parallel::parallelize(
        *m, comm::rehearsal_group(static_cast<int>(c0.group)), pc, [](std::vector<at::Tensor> params) {
          return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-4));
        });
    comm::NotLogged quiet;
    for (size_t j : group) one_step(t, *m, *par, cases[j]);  // warm-up: the optimizer's state allocated
    std::vector<double> fastest(group.size(), 1e30);
    std::vector<Peaks> most(group.size());
    const auto t0 = Clock::now();
    // two rounds at least, more while the group has taken under 0.6 s, six at most
    for (int round = 0; round < 6 && (round < 2 || since(t0) < 0.6); ++round) {
      for (size_t k = 0; k < group.size(); ++k) {
        const auto t1 = Clock::now();
        const Peaks p = one_step(t, *m, *par, cases[group[k]]);
        fastest[k] = std::min(fastest[k], since(t1));
        most[k].passes = std::max(most[k].passes, p.passes);
        most[k].step = std::max(most[k].step, p.step);
      }
    }
    for (size_t k = 0; k < group.size(); ++k) {
      const RehearsalCase& c = cases[group[k]];
      StrategyPoint p;
      p.strategy = c.strategy;
      p.group = c.group;
      p.bucket_bytes = c.bucket_bytes;
      p.checkpoint = c.checkpoint;
      p.accumulation = c.accumulation;
      p.micro_batch = c.micro_batch;
      p.step_s = fastest[k];
      p.peak_bytes = most[k].passes - before;
      p.step_peak_bytes = most[k].step - before;
      out.strategies.push_back(p);
    }
  }
}

}  // namespace dtrain::plan
