// The built-in run: models::GPT on text (one token per byte) through the Trainer (dp, zero1-3, hsdp; with
// --tp, the GPT's tensor-parallel plan × dp or zero1-3), windows drawn by a DistributedSampler, a validation
// loss and a text sample at the end. What `scripts/main.sh` runs (`dtrain train`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "parallel/tensor_parallel.h"
#include "tensor/placement.h"
#include "train/trainer.h"

namespace dtrain::train {

// The Trainer's options (strategy, precision, steps, batch in sequences, lr, checkpoints, ...) and the GPT's.
struct TrainOptions : TrainerOptions {
  std::string data = "/usr/share/games/fortunes";
  models::GPTConfig model{256, 64, 4, 4, 128};  // vocab (bytes), seq, layers, heads, width
  bool sequence_parallel = false;               // with tp > 1 (the plan's)
  std::string solve_pin_text;           // strategy solve: "NAME=PLACEMENTS;..." (parsed into solve_pins)
  bool checkpoint_activations = false;  // per block (models/checkpoint.h)
  // Text generated at the end from the trained model (rank 0 prints it): `sample_bytes` bytes after
  // `sample_prompt`, each drawn from the `top_k` likeliest at temperature 0.8 by a generator seeded with
  // `seed`.
  int64_t sample_bytes = 0;
  std::string sample_prompt = "The ";
  int64_t top_k = 10;
  std::string sample_file;   // rank 0 also writes the sample here ("" = none)
  int64_t eval_batches = 4;  // validation batches at the end
  int64_t eval_every = 0;    // and every this many steps (0: at the end only)
  // Resolved once the world size is known (resolve_options): the batch from micro_batch (sequences per
  // data-parallel rank per micro-step, DeepSpeed's train_micro_batch_size_per_gpu; 0: not set) x accumulation
  // x the data-parallel ranks; strategy "deepspeed" from zero_stage (-1: not set; 0 dp, 1-3 zero1-3);
  // strategy "auto" by the planner.
  int64_t micro_batch = 0;
  int64_t zero_stage = -1;
  bool batch_given = false, accumulation_given = false;  // set by a config, a flag or --set
  std::vector<std::string> config_notes;                 // what a DeepSpeed config's fixed keys mean here
  // The planner (strategy auto, dtrain plan; apps/dtrain/gpt/plan_gpt.h): the memory budget per rank in bytes
  // of tensors (0: free memory per rank less the runtime), the links' profile ("": measured and cached;
  // "builtin"), the top candidates to time (0: none), and the whole table printed.
  int64_t memory_budget = 0;
  std::string profile;
  int64_t auto_confirm = 0;
  bool verbose = false;
};

// Resolves what needs the world size (see micro_batch, zero_stage) in place (strategy "auto" is resolved
// before, by the planner: apps/dtrain/gpt/auto_layout.h); appends what it chose to o.config_notes.
// ValueError naming the keys.
void resolve_options(TrainOptions& o, int64_t world_size);

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

// Checks `o` alone, before any rank waits for the others: ValueError naming the flag and its value.
void check_train_options(const TrainOptions& o);

}  // namespace dtrain::train
