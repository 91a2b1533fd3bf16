// Command-line options of `dtrain train`; see cmd_train.h.
#include "apps/dtrain/cmd_train.h"

#include "core/units.h"

namespace dtrain::apps {

CLI::App* add_train_command(CLI::App& app, train::TrainOptions& o) {
  CLI::App* c =
      app.add_subcommand("train", "Train a GPT on text (one token per byte); run it inside `dtrain run`");
  // a flag given twice takes its last value: scripts/main.sh's defaults, then the user's own
  c->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--data", o.data, "A text file or a folder of text files")->capture_default_str();
  c->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str();
  c->add_option("--batch", o.batch, "Global batch (sequences), split over the data-parallel ranks")
      ->capture_default_str();
  c->add_option("--seq", o.model.block_size, "Sequence length")->capture_default_str();
  c->add_option("--layers", o.model.n_layer, "Transformer blocks")->capture_default_str();
  c->add_option("--heads", o.model.n_head, "Attention heads")->capture_default_str();
  c->add_option("--width", o.model.n_embd, "Model width (a multiple of --heads)")->capture_default_str();
  c->add_option("--tp", o.tp,
                "Tensor-parallel ranks (consecutive): Megatron's block layout (q, k, v and fc colwise, the "
                "projections rowwise, the embedding vocabulary parallel, loss-parallel cross entropy); "
                "--strategy runs over the other mesh axis")
      ->capture_default_str();
  c->add_flag("--sequence-parallel", o.sequence_parallel,
              "With --tp: LayerNorms and residuals on each rank's part of the sequence (all-gather / "
              "reduce-scatter at the block edges instead of all-reduce)");
  c->add_option("--strategy", o.strategy,
                "dp (Horovod-style data parallel; also ddp, horovod), zero1, zero2, zero3 (DeepSpeed ZeRO "
                "stages; also deepspeed1..3, fsdp), hsdp (zero3 within groups of --shard-size ranks, "
                "replicated across them)")
      ->capture_default_str();
  c->add_option("--shard-size", o.shard_size, "hsdp: ranks per ZeRO-3 group (consecutive ranks)");
  c->add_option_function<std::string>(
      "--bucket-bytes", [&o](const std::string& v) { o.bucket_bytes = parse_bytes("--bucket-bytes", v); },
      "Gradient bucket size, e.g. 25M (default 25M, or HOROVOD_FUSION_THRESHOLD); under zero3/hsdp also "
      "the most bytes of parameters gathered together (a unit of whole submodules)");
  c->add_option(
       "--accumulation", o.accumulation,
       "Micro-batches per step: the global batch is split this many ways, gradients communicated once")
      ->capture_default_str();
  c->add_option(
       "--clip", o.clip,
       "Clip the gradients to this global L2 norm over every shard and mesh axis (0: no clipping); the "
       "norm before clipping is logged")
      ->capture_default_str();
  c->add_option(
       "--precision", o.precision,
       "fp32, bf16 or fp16: compute precision, with fp32 master weights in the optimizer and, for fp16, "
       "DeepSpeed's dynamic loss scaling (initial 2^16, window 1000, hysteresis 2); any --strategy and --tp")
      ->capture_default_str();
  c->add_option("--loss-scale", o.loss_scale,
                "fp16: 0 for DeepSpeed's dynamic loss scaling (the default), or a static scale, e.g. 1024 "
                "(DeepSpeed's fp16.loss_scale); an overflowing step is skipped either way")
      ->capture_default_str();
  c->add_option(
      "--reduce-dtype", o.reduce_dtype,
      "fp32, bf16 or fp16: the dtype gradients are reduced in (default: the --precision's), e.g. fp32 "
      "under bf16 so that the ranks' gradients are summed in fp32 and rounded once");
  c->add_flag("--checkpoint-activations", o.checkpoint_activations,
              "Activation checkpointing per transformer block: each block keeps only its input and "
              "recomputes the rest in backward (less memory, one more forward of compute)");
  c->add_flag("--deterministic", o.deterministic,
              "Bitwise the same parameters at any power-of-2 number of data-parallel ranks (dp, zero1-3; the "
              "same intra-op threads per rank): the global batch is cut into --accumulation fixed "
              "micro-batches (a multiple of the ranks, a power of 2 per rank), their gradients summed as one "
              "balanced tree");
  c->add_option("--metrics", o.metrics,
                "Write one JSON object per step (step, loss, lr, elapsed_s, tokens_per_s, grad_norm with "
                "--clip) to this file");
  c->add_option(
      "--save", o.save,
      "Save checkpoints under this folder (step-<N>, and 'latest' naming the newest): every "
      "--save-every steps and at the end; sharded, atomic, loadable at any world size and strategy");
  c->add_option("--save-every", o.save_every, "Steps between checkpoints (0: at the end only)")
      ->capture_default_str();
  c->add_option("--keep", o.keep, "Checkpoints kept under --save, the newest (0: all)")
      ->capture_default_str();
  c->add_option(
      "--resume", o.resume,
      "Continue the run saved here (a step folder, or a --save folder: its latest) from its step, "
      "under any world size, --strategy and --tp (with --steps at or below the saved step and --save: "
      "save it again under this layout)");
  c->add_option("--init-from", o.init_from,
                "Start from the weights of this safetensors file (e.g. `dtrain ckpt export`'s), any layout");
  c->add_option("--lr", o.lr, "AdamW's (peak) learning rate")->capture_default_str();
  c->add_option("--lr-schedule", o.lr_schedule,
                "constant, or cosine: a half cosine from --lr down to --min-lr at the last step (both after "
                "--warmup)")
      ->capture_default_str();
  c->add_option("--warmup", o.warmup, "Steps of linear warmup from lr/warmup up to --lr")
      ->capture_default_str();
  c->add_option("--min-lr", o.min_lr, "The cosine schedule's last learning rate (negative: --lr / 10)")
      ->capture_default_str();
  c->add_option("--sample", o.sample_bytes,
                "Generate this many bytes of text after the training (after --sample-prompt) and print them")
      ->capture_default_str();
  c->add_option("--sample-prompt", o.sample_prompt, "The text the sample continues")->capture_default_str();
  c->add_option("--sample-file", o.sample_file, "Also write the sample to this file");
  c->add_option("--top-k", o.top_k, "The sample draws each byte from the k likeliest (temperature 0.8)")
      ->capture_default_str();
  c->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str();
  c->add_option("--eval-batches", o.eval_batches,
                "Batches of the held-out text (the last 5%) the validation loss at the end averages")
      ->capture_default_str();
  c->add_option("--log-every", o.log_every, "Log the loss every this many steps")->capture_default_str();
  c->add_option("--seed", o.seed, "Seed of the weights and of the batches")->capture_default_str();
  return c;
}

}  // namespace dtrain::apps
