// The reference-versus-parallel loop the strategy suites share (worker_parallel.cpp, worker_tp.cpp,
// worker_numerics.cpp): the same GPT twice (twin_gpts), one trained on this process with plain libtorch on
// every row of each micro-batch, the other laid out by a strategy and trained on this rank's rows; after each
// step the parallel loss, summed over the ranks, is compared with the reference's.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>

#include "comm/backend.h"
#include "models/gpt.h"
#include "parallel/parallelize.h"

namespace dtrain::test {

// What the loop does on the parallel side.
struct ParallelSide {
  std::function<void()> zero_grad;
  std::function<void(bool sync)> set_requires_gradient_sync;
  std::function<void()> step;
};
ParallelSide side_of(parallel::Parallelized& par);

struct ParityLoop {
  std::string tag;  // "dp accumulation 2 buckets 4096: "
  int64_t steps = 20;
  int64_t accumulation = 1;
  // The data-parallel ranks and this rank's place among them; tp ranks of one place compute the same loss.
  int64_t dp_size = 1, dp_rank = 0, tp = 1;
  double loss_tol = 1e-5;
  // Micro-batch k of step `step` ([rows, block_size + 1] token ids), the same on every rank.
  std::function<at::Tensor(int64_t step, int64_t k)> micro_batch;
  // Optional hooks for each suite's own checks (communication, recomputations, memory).
  std::function<void(int64_t step, int64_t k)> before_micro, after_forward, after_backward;
  std::function<void(int64_t step)> before_step, after_step;
  // The reference's own, between its backward and its optimizer step (e.g. clipping with libtorch).
  std::function<void(int64_t step)> reference_before_step;
};

// Runs `loop`: per step, the reference's AdamW step on every row (each micro-batch's loss weighted by its
// share of the step's rows) and the parallel side's on this rank's rows of each micro-batch (balanced over
// dp_size), gradient sync on the last micro-batch only; each step's loss checked within loop_tol.
void run_parity(const comm::BackendPtr& world, models::GPT& ref, torch::optim::Optimizer& ref_opt,
                models::GPT& gpt, const ParallelSide& side, const ParityLoop& loop);

// The small GPT of the data-parallel and ZeRO suites (vocabulary 64, 16 tokens, 2 layers, 2 heads).
models::GPTConfig small_gpt(int64_t width = 32);
// [rows, block_size + 1] token windows drawn from `seed`, the same on every rank.
at::Tensor token_windows(int64_t rows, const models::GPTConfig& c, uint64_t seed);
// Bytes of a module's parameters.
int64_t param_bytes(torch::nn::Module& m);

// This rank's part of the whole parameter `whole` named `name` under `par` (itself without tensor parallel).
at::Tensor part_of(parallel::Parallelized& par, const std::string& name, const at::Tensor& whole);
// Every parameter of `gpt` (laid out by `par`) within relative `tol` of its part of `ref`'s.
void check_final_parameters(const std::string& tag, models::GPT& ref, models::GPT& gpt,
                            parallel::Parallelized& par, double tol);

}  // namespace dtrain::test
