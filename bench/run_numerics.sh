#!/usr/bin/env bash
# Issue 12's costs, on 2 ranks (Gloo), the same GPT and settings on every side, alternating sides each round:
#  - mixed precision: `dtrain train --precision bf16|fp16` against fp32, and the bookkeeping it adds outside the
#    model's compute (casts into and out of the fp32 masters, the inf/nan check and its all-reduce, the scaler),
#    as a share of the step; PyTorch DDP fp32 in the same run for scale;
#  - deterministic mode: dp and zero3 with --deterministic (2 fixed micro-batches, one per rank) against the
#    same per-rank work without it;
#  - activation checkpointing: peak memory and step time with and without --checkpoint-activations, against
#    PyTorch DDP with and without torch.utils.checkpoint per block, at a size whose activations dominate.
# Prints the markdown tables for bench/RESULTS.md. Build first.
#   bash bench/run_numerics.sh [OUT_DIR]        (ROUNDS=2 STEPS=40 by default; PARTS="mixed det acts")
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/build/apps/dtrain:$PATH
out=${1:-bench/out/numerics}
rounds=${ROUNDS:-2}
steps=${STEPS:-40}
parts=${PARTS:-mixed det acts}
mkdir -p "$out"
small="--layers 4 --width 128 --heads 4 --seq 64 --batch 16"
acts="--layers 4 --width 128 --heads 4 --seq 256 --batch 32"
run() {  # name, launcher args..., --, command...
  local name=$1
  shift
  dtrain run -n 2 --backend gloo -- "$@" --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1
}
for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  if [[ " $parts " == *" mixed "* ]]; then
    run "fp32-$r" dtrain train $small --steps "$steps" --log-every 100000
    run "ddp-$r" .venv/bin/python bench/gpt_ddp.py $small --steps "$steps"
    run "bf16-$r" dtrain train $small --steps "$steps" --log-every 100000 --precision bf16
    run "fp16-$r" dtrain train $small --steps "$steps" --log-every 100000 --precision fp16
    run "bf16_reduce_fp32-$r" dtrain train $small --steps "$steps" --log-every 100000 --precision bf16 \
      --reduce-dtype fp32
  fi
  # shellcheck disable=SC2086
  if [[ " $parts " == *" det "* ]]; then
    run "dp_nondet-$r" dtrain train $small --steps "$steps" --log-every 100000 --accumulation 1
    run "dp_det-$r" dtrain train $small --steps "$steps" --log-every 100000 --accumulation 2 --deterministic
    run "zero3_nondet-$r" dtrain train $small --steps "$steps" --log-every 100000 --strategy zero3
    run "zero3_det-$r" dtrain train $small --steps "$steps" --log-every 100000 --strategy zero3 \
      --accumulation 2 --deterministic
  fi
  # shellcheck disable=SC2086
  if [[ " $parts " == *" acts "* ]]; then
    run "acts_dtrain-$r" dtrain train $acts --steps 20 --log-every 100000
    run "acts_dtrain_ckpt-$r" dtrain train $acts --steps 20 --log-every 100000 --checkpoint-activations
    run "acts_ddp-$r" .venv/bin/python bench/gpt_ddp.py $acts --steps 20
    run "acts_ddp_ckpt-$r" .venv/bin/python bench/gpt_ddp.py $acts --steps 20 --checkpoint
  fi
done
.venv/bin/python bench/report_numerics.py "$out"
