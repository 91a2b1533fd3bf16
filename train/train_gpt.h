// A first training run: models::GPT on text (one token per byte) through parallel::parallelize (dp,
// zero1-3, hsdp; with --tp, the GPT's tensor-parallel plan × dp or zero1-3), AdamW, loss logged on rank 0.
// What `scripts/main.sh` runs (`dtrain train`).
#pragma once

#include <cstdint>
#include <string>

#include "models/gpt.h"
#include "parallel/tensor_parallel.h"
#include "tensor/placement.h"

namespace dtrain::train {

struct TrainOptions {
  std::string data = "/usr/share/games/fortunes";
  models::GPTConfig model{256, 64, 4, 4, 128};  // vocab (bytes), seq, layers, heads, width
  int64_t batch = 16;                           // global: split over the data-parallel ranks
  int64_t steps = 300;
  int64_t tp = 1;  // tensor-parallel ranks (gpt_tensor_parallel_plan); the rest of the world is data parallel
  bool sequence_parallel = false;
  std::string strategy = "dp";  // parallel::parse_strategy's names
  int64_t shard_size = 0;       // hsdp: ranks per ZeRO-3 group
  int64_t bucket_bytes = 0;     // data parallel's gradient buckets; 0: 25 MiB or HOROVOD_FUSION_THRESHOLD
  int64_t accumulation = 1;     // micro-batches per optimizer step (the global batch split K ways)
  double clip = 0;              // global gradient-norm clipping (optim::clip_grad_norm); 0: none
  std::string precision =
      "fp32";                // fp32, bf16, fp16 (optim::MixedPrecision: fp32 masters; fp16 loss scaling)
  double loss_scale = 0;     // fp16: 0 dynamic (DeepSpeed's defaults), else a static scale
  std::string reduce_dtype;  // the gradients' reduction dtype ("": the precision's)
  bool checkpoint_activations = false;  // per block (models/checkpoint.h)
  bool deterministic = false;  // DataParallelOptions::deterministic: accumulation = all micro-batches
  std::string metrics;         // a JSONL file, one object per step on rank 0 ("" = none)
  // Checkpoints (checkpoint/training_state.h): saved under `save` every `save_every` steps and at the end,
  // the newest `keep` kept; `resume` (a step folder, or a root: its latest) continues that run from its step;
  // `init_from` (a safetensors file, e.g. an export) starts from its weights.
  std::string save;
  int64_t save_every = 0;  // 0: at the end only
  int64_t keep = 3;
  std::string resume;
  std::string init_from;
  double lr = 1e-3;  // the peak learning rate
  // A linear warmup from lr/warmup to lr over the first `warmup` steps, then constant: `lr`; cosine: a half
  // cosine from lr down to `min_lr` at the last step. A function of the step alone, so that a resumed run
  // continues it exactly (with the same --steps).
  std::string lr_schedule = "constant";
  int64_t warmup = 0;
  double min_lr = -1;  // negative: lr / 10
  double weight_decay = 0.1;
  // Text generated at the end from the trained model (rank 0 prints it): `sample_bytes` bytes after
  // `sample_prompt`, each drawn from the `top_k` likeliest at temperature 0.8 by a generator seeded with
  // `seed`.
  int64_t sample_bytes = 0;
  std::string sample_prompt = "The ";
  int64_t top_k = 10;
  std::string sample_file;  // rank 0 also writes the sample here ("" = none)
  int64_t log_every = 20;
  int64_t eval_batches = 4;  // validation batches at the end
  uint64_t seed = 1234;
};

// Megatron's layout of models::GPT as a tensor-parallel plan: q, k, v colwise and the attention projection
// rowwise by whole heads (unit head_dim), the MLP's fc colwise and proj rowwise, the token embedding
// vocabulary parallel (its tied output head giving loss-parallel logits); under sequence parallel also the
// position embedding and the LayerNorms.
parallel::TensorParallelPlan gpt_tensor_parallel_plan(const models::GPTConfig& c, bool sequence_parallel);
// The same layout for a DTensor-distributed GPT (tensor/distribute_module.h): the placement of a parameter
// on the tensor-parallel mesh axis, from the plan's style of its module (colwise: Shard(0), rowwise weight:
// Shard(1), others Replicate).
tensor::Placement gpt_tp_placement(const std::string& param_name);

// Runs the training in this process as one rank of the world (dtrain::init()). Returns 0; throws ValueError
// for bad options (world not divisible by tp, ...).
int train_gpt(const TrainOptions& opts);

// The learning rate of step `step` (1-based) under `o`'s schedule; ValueError naming the flag for a bad one.
double scheduled_lr(const TrainOptions& o, int64_t step);
void check_schedule(const TrainOptions& o);

}  // namespace dtrain::train
