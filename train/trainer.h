// Trainer: the training loop for a user's own torch::nn::Module, loss function and data, over any layout of
// parallel::parallelize (dp, zero1-3, hsdp, tensor parallel), with mixed precision, gradient accumulation,
// clipping, AdamW with a warmup + cosine schedule, checkpoints (save, resume, elastic resume, import), a log
// and metrics on rank 0, and callbacks: the C++ counterpart of HF Trainer's and Lightning's loop.
//
//   dtrain::train::TrainerOptions o;           // strategy, precision, lr, steps, save, ...
//   o.batch = 32;                              // samples per step, over all ranks
//   dtrain::train::Trainer t(model, loss, batches, o);
//   t.fit();
//
// `batches(step)` returns the step's global batch, the same on every rank: tensors whose dim 0 is the
// samples; each data-parallel rank takes its rows of each micro-batch (the ranks of a tensor-parallel group
// the same rows) and `loss` returns the mean loss of the rows it is given. DistributedSampler (below) makes
// such batches from a dataset of N samples: disjoint, complete epochs, deterministic by seed, resumable.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "optim/loss_scaler.h"
#include "parallel/tensor_parallel.h"
#include "train/distributed_sampler.h"

namespace dtrain::parallel {
class Parallelized;
}
namespace dtrain::optim {
class MixedPrecision;
}
namespace dtrain::checkpoint {
class TrainingState;
}
namespace dtrain::train {
class SolvedRun;
}

namespace dtrain::train {

struct TrainerOptions {
  // Layout (parallel::ParallelConfig): the strategy's names (parallel::parse_strategy), hsdp's group size,
  // the tensor-parallel degree and plan (with the plan's sequence_parallel), the gradient buckets (0: 25 MiB
  // or HOROVOD_FUSION_THRESHOLD), module patterns recomputed in backward (activation checkpointing).
  std::string strategy = "dp";
  int64_t shard_size = 0;
  int64_t tp = 1;
  parallel::TensorParallelPlan tp_plan;
  int64_t bucket_bytes = 0;
  std::vector<std::string> activation_checkpointing;
  // The mesh's axes, outermost first, comma-separated (ParallelConfig::mesh_order): "tp,dp" lays the tp
  // groups across hosts, "shard,replicate" hsdp's shard groups; "" the default, tp or shard inside a host.
  std::string mesh_order;
  // Bitwise the same parameters at any power-of-2 number of data-parallel ranks (DataParallelOptions).
  bool deterministic = false;
  // strategy "solve" (train/solved_run.h): the whole-step sharding solver's layout. The mesh's axis sizes
  // ("2,2"; "": one axis of every rank), the memory per rank the plan must fit (bytes; 0: none), constraints
  // (value name, placements: "h0.mlp.fc.weight", "S(0)"; the inputs are batch0, batch1, ... and batch0:k for
  // micro-batch k), and the mesh axis the batch stays sharded over (-1: the solver's choice).
  std::string solve_mesh;
  int64_t solve_budget = 0;
  std::vector<std::pair<std::string, std::string>> solve_pins;
  int64_t solve_batch_axis = 0;
  // Numerics: fp32, bf16 or fp16 with fp32 master weights; fp16: 0 dynamic loss scaling (from
  // 2^initial_scale_power, with the scaler's window, hysteresis and minimum: DeepSpeed's fp16 block), else a
  // static scale; the gradients' reduction dtype ("": the precision's); global gradient-norm clipping (0:
  // none).
  std::string precision = "fp32";
  double loss_scale = 0;
  double initial_scale_power = 16;
  optim::LossScalerOptions scaler;  // window, hysteresis, min_scale, consecutive_hysteresis
  std::string reduce_dtype;
  double clip = 0;
  // Steps and batches: `batch` samples per optimizer step over all data-parallel ranks, split into
  // `accumulation` micro-batches (gradients communicated once per step).
  int64_t steps = 300;
  int64_t batch = 16;
  int64_t accumulation = 1;
  // AdamW, and its learning rate: a warmup over the first `warmup` steps from warmup_min_lr (negative: a line
  // from 0, lr/warmup at step 1) up to lr, linear or (warmup_type "log") DeepSpeed's logarithmic one; then
  // constant: lr; cosine: a half cosine from lr down to min_lr (negative: lr / 10) at the last step; linear:
  // DeepSpeed's WarmupDecayLR, a line from lr at step warmup + 1 down to min_lr at step steps + 1. A function
  // of the step alone, so that a resumed run continues it exactly.
  std::string optimizer = "adamw";
  double lr = 1e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::string lr_schedule = "constant";
  int64_t warmup = 0;
  std::string warmup_type = "linear";
  double warmup_min_lr = -1;
  double min_lr = -1;
  // Checkpoints (checkpoint/training_state.h): saved under `save` every `save_every` steps (0: at the end
  // only) and at the end, the newest `keep` kept (0: all); `resume`: a step folder, or a root (its latest),
  // or "auto" (the latest under `save` if any, else a fresh start; also what a group restarted by `dtrain run
  // --max-restarts` does when `save` is set and `resume` is not: elastic resume); `init_from`: a safetensors
  // file whose weights a new run starts from.
  std::string save;
  int64_t save_every = 0;
  int64_t keep = 3;
  std::string resume;
  std::string init_from;
  // Rank 0's log line every `log_every` steps; `metrics`: a JSONL file, one object per step (loss, lr, rates,
  // rss_mib and tensor_peak_mib per rank: the resident set, and the peak of bytes held by tensors since the
  // record before, counted by dispatch/tensor_memory.h from the Trainer's construction, or from earlier where
  // the caller installed the counter before building the model; the set-up before fit() is not in the
  // peak; under dp, where the loss rides with the gradients, it costs one small all-reduce a step of its
  // own); `timeline`: a
  // Chrome-trace (Perfetto) JSON file of every rank's forward, backward, optimizer and each collective,
  // written by rank 0 at the end of fit().
  int64_t log_every = 20;
  std::string metrics;
  std::string timeline;
  // Seeds libtorch's default generator at construction (seed + rank: dropout and the user's own draws
  // repeat); saved with the data position, and a resumed run with another seed is told so.
  uint64_t seed = 1234;
  // Tokens (or samples) per sample, for the rate in the log (1: samples/s).
  int64_t tokens_per_sample = 1;
};

// Deterministic mode's default micro-batch count: the step's batch cut into this many micro-batches of one
// size gives bitwise the same parameters at every power-of-2 number of data-parallel ranks up to
// kDeterministicMaxRanks (1, 2, 4, 8), or up to `dp_ranks` when that is larger: each rank sums its own
// micro-batches as a subtree of one balanced tree. ValueError, naming the batch sizes that would do, when
// `batch` is not a multiple of it.
constexpr int64_t kDeterministicMaxRanks = 8;
int64_t deterministic_accumulation(int64_t batch, int64_t dp_ranks);

// Checks `o` alone (no world yet): ValueError naming the option, its value and what is allowed.
void check_trainer_options(const TrainerOptions& o);

struct StepInfo {
  int64_t step = 0;
  double loss = 0;  // the global mean loss (NaN on steps whose loss was not gathered: see wants_loss)
  double lr = 0;
  double grad_norm = -1;   // before clipping, with clip > 0; else negative
  bool skipped = false;    // fp16: an inf or nan in the gradients, the step not taken
  double seconds = 0;      // since fit() began
  double comm_wait_s = 0;  // this rank's time blocked waiting for communication in the step (not hidden)
};

class Trainer;

// Callbacks: override what you need. They run on every rank (collectives allowed, alike on every rank);
// trainer.lead() is rank 0.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_start(Trainer&) {}
  virtual void on_step_end(Trainer&, const StepInfo&) {}
  // After fit()'s evaluations (every eval_every steps and at the end, with an eval set).
  virtual void on_evaluate(Trainer&, int64_t step, double loss) {}
  // A checkpoint was saved to `dir` (every rank, after the save).
  virtual void on_checkpoint(Trainer&, int64_t step, const std::string& dir) {}
  virtual void on_train_end(Trainer&) {}
  // fit() threw: called before the exception leaves fit().
  virtual void on_exception(Trainer&, const std::exception&) {}
  // Whether step `step` needs the global loss (a collective on steps that are not logged otherwise).
  virtual bool wants_loss(int64_t step) { return false; }
};

class Trainer {
 public:
  using Batch = std::vector<at::Tensor>;
  // The mean loss of the rows given (a scalar; its backward gives the gradients).
  using LossFn = std::function<at::Tensor(const Batch& rows)>;
  // The global batch of a step (1-based), the same on every rank; dim 0 of each tensor: the samples.
  using BatchFn = std::function<Batch(int64_t step)>;

  // Applies the layout to `model` (collective over `world`: every rank constructs it), builds AdamW, and
  // loads `resume` or `init_from`. ValueError for bad options, before anything is changed.
  Trainer(torch::nn::Module& model, LossFn loss, BatchFn batches, TrainerOptions options,
          comm::BackendPtr world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void add_callback(std::shared_ptr<Callback> cb);
  // An evaluation set: `batches` batches of `eval(b)` (b = 0, 1, ...), every `every` steps (0: at the end
  // only) and at the end; the mean loss goes to on_evaluate, the log and the metrics.
  void set_evaluation(BatchFn eval, int64_t batches, int64_t every = 0);

  // Trains steps first_step() .. options().steps; saves as options ask. Collective.
  void fit();
  // The mean loss over `batches` batches of `eval` (no gradients; every rank takes the whole batch).
  // Collective under ZeRO-3 and tensor parallel.
  double evaluate(const BatchFn& eval, int64_t batches);
  // Saves the current state under options().save (or `root`). Collective. Returns the step folder.
  std::string save(int64_t step, const std::string& root = "");

  const TrainerOptions& options() const { return o_; }
  torch::nn::Module& model() { return model_; }
  // The layout (ValueError under strategy solve, which has none: see solved_run()).
  parallel::Parallelized& parallelized();
  // Under strategy solve: the solved run (else null).
  SolvedRun* solved_run() { return solved_.get(); }
  optim::MixedPrecision& mixed_precision() { return *mp_; }
  const comm::BackendPtr& world() const { return world_; }
  bool lead() const;
  int64_t first_step() const { return first_step_; }  // 1, or the step after the resumed one
  int64_t data_parallel_size() const { return n_; }
  // The global loss of the first and last step fit() ran (0 before).
  double first_loss() const { return first_loss_; }
  double last_loss() const { return last_loss_; }
  // Communication of the last step fit() ran, by the op that caused it (comm::CommLog's summary).
  const std::string& last_step_comm() const { return last_step_comm_; }
  // The caller's part of each checkpoint's meta (e.g. a sampler's position); the trainer adds seed and batch.
  nlohmann::json checkpoint_meta;
  // What resume loaded (empty before, or without resume).
  nlohmann::json resumed_meta;

 private:
  class Log;
  // One optimizer step; fills `info` (the global loss only with want_loss).
  void run_step(int64_t step, StepInfo& info, bool want_loss, Log& log);
  void run_solved_step(int64_t step, const Batch& global, StepInfo& info, bool want_loss, Log& log);
  void resume_or_import();
  void write_timeline();  // collective

  torch::nn::Module& model_;
  LossFn loss_;
  BatchFn batches_;
  TrainerOptions o_;
  comm::BackendPtr world_;
  int64_t n_ = 1, me_ = 0;  // data-parallel ranks, and this rank's place among them
  std::unique_ptr<optim::MixedPrecision> mp_;
  std::unique_ptr<parallel::Parallelized> par_;
  std::unique_ptr<SolvedRun> solved_;  // strategy solve (then no par_ and no state_)
  std::unique_ptr<checkpoint::TrainingState> state_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  BatchFn eval_;
  int64_t eval_batches_ = 0, eval_every_ = 0;
  bool loss_rides_ = false;
  int64_t first_step_ = 1;
  double first_loss_ = 0, last_loss_ = 0;
  std::vector<double>
      last_rss_;  // each rank's resident memory (MiB) at the last step whose loss was gathered
  // each rank's peak of bytes held by tensors (MiB) since the record before (dispatch/tensor_memory.h)
  std::vector<double> last_tensor_peak_;
  std::string last_step_comm_;
};

}  // namespace dtrain::train
