// Measures a module's compute profile (plan/compute_profile.h) in this process alone: for each setting (the
// tensor-parallel degrees asked for, with and without sequence parallel, each with activation checkpointing
// off and, where the module has blocks that can recompute, on), a fresh copy of the module, split as one
// rank of that degree holds it (the plan's styles over a rehearsal group, comm/rehearsal.h), runs forward and
// backward of one micro-batch at a few sizes, timed and with the bytes its tensors peak at counted
// (dispatch/tensor_memory.h); then AdamW's step over the whole module's parameters. Bounded in time; cached
// by signature.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/grad_reduction_options.h"
#include "parallel/tensor_parallel.h"
#include "plan/compute_profile.h"

namespace dtrain::plan {

struct ProfileTarget {
  // A fresh module as the run builds it (its dtype is the profile's).
  std::function<std::shared_ptr<torch::nn::Module>()> build;
  // The mean loss of a micro-batch of `micro_batch` samples of the run's shape (any values).
  std::function<at::Tensor(torch::nn::Module&, int64_t micro_batch)> loss;
  // Module-name patterns that activation checkpointing would recompute (empty: checkpointing is not
  // measured).
  std::vector<std::string> checkpoint_patterns;
  // The tensor-parallel plan without and with sequence parallel (null: tensor parallel is not measured).
  std::function<parallel::TensorParallelPlan(bool sequence_parallel)> tp_plan;
  // tp_plan(true) is a working sequence-parallel plan (the sequence enters the module through a
  // sequence-parallel or vocabulary-parallel embedding, as the GPT's does): sequence parallel is measured and
  // planned. False: it is not a candidate.
  bool sequence_parallel = false;
  // The model and its input, readable ("GPT 4x128, 4 heads, seq 64"): shown, and part of the signature.
  std::string description;
};

// A strategy's step to rehearse (plan/rehearse_strategy.h).
struct RehearsalCase {
  std::string strategy;  // dp, zero1, zero2, zero3
  int64_t group = 2;     // data-parallel ranks
  int64_t bucket_bytes = parallel::GradReductionOptions{}.bucket_bytes;
  bool checkpoint = false;
  int64_t accumulation = 1;
  int64_t micro_batch = 1;
};

struct MeasureOptions {
  // The largest micro-batch (per rank) to measure at each tensor-parallel degree (1 included); each is
  // measured at it and at every half of it down to smallest_micro_batch, largest first.
  std::vector<std::pair<int64_t, int64_t>> largest_micro_batch{{1, 4}};
  int64_t smallest_micro_batch = 1;
  int repeats = 3;           // timed repeats per size (the median is kept)
  double time_limit_s = 30;  // larger sizes are skipped once this is spent
  // The strategies' rehearsals (plan/rehearse_strategy.h), after the settings.
  std::vector<RehearsalCase> rehearsals;
};

// The signature of `target`'s module (every parameter's name, shape and dtype), its description, the settings
// and sizes measured, this process's intra-op thread count: a hex digest.
std::string compute_signature(const ProfileTarget& target, const MeasureOptions& opts,
                              torch::nn::Module& built);

// Measures now. ValueError when the target cannot run (no build or loss function, a loss that is not a
// scalar).
ComputeProfile measure_compute(const ProfileTarget& target, const MeasureOptions& opts);

// The profile cached in `cache_dir` (compute-<signature>.json) when there is one, else measured and, when
// `write` (one rank of a job: the one whose figures decide), written there. `*measured` (when given) says
// which.
ComputeProfile cached_compute_profile(const ProfileTarget& target, const MeasureOptions& opts,
                                      const std::string& cache_dir, bool* measured = nullptr,
                                      bool write = true);

// $DTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/dtrain, else ~/.cache/dtrain (created when missing).
std::string default_cache_dir();

}  // namespace dtrain::plan
