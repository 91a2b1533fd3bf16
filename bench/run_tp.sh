#!/usr/bin/env bash
# Tensor parallel: `dtrain train --tp 2` (its block styles, vocabulary-parallel embedding and loss-parallel cross
# entropy) vs PyTorch 2.13's DTensor tensor parallelism (bench/gpt_ddp.py --tp 2: colwise q/k/v and fc, rowwise
# projections), each with and without sequence parallel, on the same GPT from the same initial weights, Gloo
# both sides, 2 ranks, same launcher and thread settings, alternating sides each round, at the two sizes of
# bench/run_dp_vs_ddp.sh; then a record of 2-d at 4 ranks (dp x tp and zero3 x tp; PyTorch: FSDP2 x TP), small
# size, one round. Prints the markdown table for bench/RESULTS.md with each side's collectives per step. Build
# first.
#   bash bench/run_tp.sh [OUT_DIR]        (ROUNDS=3 STEPS=60 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/build/apps/dtrain:$PATH
out=${1:-bench/out/tp}
rounds=${ROUNDS:-3}
steps=${STEPS:-60}
mkdir -p "$out"
declare -A size=([small]="--layers 4 --width 128 --heads 4 --seq 64 --batch 16"
                 [medium]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16")
dtrain_side() {  # name ranks size args...
  local name=$1 n=$2 s=$3 r=$4
  shift 4
  # shellcheck disable=SC2086
  dtrain run -n "$n" --backend gloo -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 "$@" \
    --metrics "$out/$name-$s-$r.jsonl" > "$out/$name-$s-$r.log" 2>&1
}
torch_side() {
  local name=$1 n=$2 s=$3 r=$4
  shift 4
  # shellcheck disable=SC2086
  dtrain run -n "$n" --backend gloo -- .venv/bin/python bench/gpt_ddp.py ${size[$s]} --steps "$steps" "$@" \
    --metrics "$out/$name-$s-$r.jsonl" > "$out/$name-$s-$r.log" 2>&1
}
for s in small medium; do
  for r in $(seq "$rounds"); do
    dtrain_side dtrain-tp 2 "$s" "$r" --tp 2
    torch_side torch-tp 2 "$s" "$r" --tp 2
    dtrain_side dtrain-tp-sp 2 "$s" "$r" --tp 2 --sequence-parallel
    torch_side torch-tp-sp 2 "$s" "$r" --tp 2 --sp
  done
done
dtrain_side dtrain-dp2xtp2 4 small 1 --tp 2
torch_side torch-fsdp2xtp2 4 small 1 --tp 2
dtrain_side dtrain-zero3xtp2 4 small 1 --tp 2 --strategy zero3
.venv/bin/python bench/report_tp.py "$out"
