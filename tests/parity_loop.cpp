// The shared parity loop; see parity_loop.h.
#include "tests/parity_loop.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/balanced_split.h"
#include "core/error.h"
#include "tests/worker_checks.h"

namespace dtrain::test {

ParallelSide side_of(parallel::Parallelized& par) {
  return {[&par] { par.zero_grad(); }, [&par](bool sync) { par.set_requires_gradient_sync(sync); },
          [&par] { par.step(); }};
}

void run_parity(const comm::BackendPtr& world, models::GPT& ref, torch::optim::Optimizer& ref_opt,
                models::GPT& gpt, const ParallelSide& side, const ParityLoop& loop) {
  const int64_t T = ref->config.block_size;
  for (int64_t step = 1; step <= loop.steps; ++step) {
    std::vector<at::Tensor> micro;
    int64_t rows = 0;
    for (int64_t k = 0; k < loop.accumulation; ++k) {
      micro.push_back(loop.micro_batch(step, k));
      rows += micro.back().size(0);
    }
    // The reference: every row, each micro-batch's mean loss weighted by its share of the step's rows.
    ref_opt.zero_grad();
    double ref_loss = 0;
    for (const at::Tensor& w : micro) {
      const double weight = static_cast<double>(w.size(0)) / static_cast<double>(rows);
      at::Tensor l = ref->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
      (l * weight).backward();
      ref_loss += l.item<double>() * weight;
    }
    if (loop.reference_before_step) loop.reference_before_step(step);
    ref_opt.step();

    // The parallel side: this rank's rows of each micro-batch; the strategy averages the gradients over the
    // data-parallel ranks, so each rank's loss is scaled by its share of the rows times dp_size.
    side.zero_grad();
    double share = 0;
    for (int64_t k = 0; k < loop.accumulation; ++k) {
      if (loop.before_micro) loop.before_micro(step, k);
      const at::Tensor& w = micro[k];
      const Range mine = balanced_part(w.size(0), loop.dp_size, loop.dp_rank);
      const at::Tensor r = w.narrow(0, mine.start, mine.count);
      side.set_requires_gradient_sync(k == loop.accumulation - 1);
      at::Tensor loss = gpt->loss(r.narrow(1, 0, T).contiguous(), r.narrow(1, 1, T).contiguous());
      if (loop.after_forward) loop.after_forward(step, k);
      const double weight = static_cast<double>(mine.count) / static_cast<double>(rows);
      (loss * (weight * static_cast<double>(loop.dp_size))).backward();
      if (loop.after_backward) loop.after_backward(step, k);
      share += loss.item<double>() * weight / static_cast<double>(loop.tp);
    }
    if (loop.before_step) loop.before_step(step);
    side.step();
    if (loop.after_step) loop.after_step(step);
    at::Tensor l = at::full({1}, share, at::kDouble);
    world->all_reduce(l)->wait();
    check_relative(str_cat(loop.tag, "step ", step, " loss"), l, at::full({1}, ref_loss, at::kDouble),
                   loop.loss_tol);
  }
}

models::GPTConfig small_gpt(int64_t width) {
  models::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = width;
  c.seed = 7;
  return c;
}

at::Tensor token_windows(int64_t rows, const models::GPTConfig& c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {rows, c.block_size + 1}, gen, at::kLong);
}

int64_t param_bytes(torch::nn::Module& m) {
  int64_t b = 0;
  for (const auto& p : m.parameters()) b += p.numel() * p.element_size();
  return b;
}

at::Tensor part_of(parallel::Parallelized& par, const std::string& name, const at::Tensor& whole) {
  if (auto* tpl = par.tensor_parallel()) {
    const auto p = tpl->part_of(name);
    if (p.count >= 0) return whole.narrow(p.dim, p.start, p.count);
  }
  return whole;
}

void check_final_parameters(const std::string& tag, models::GPT& ref, models::GPT& gpt,
                            parallel::Parallelized& par, double tol) {
  auto have = gpt->named_parameters();
  for (const auto& item : ref->named_parameters()) {
    check_relative(str_cat(tag, "final ", item.key()), have[item.key()].detach().clone(),
                   part_of(par, item.key(), item.value().detach()), tol);
  }
}

}  // namespace dtrain::test
