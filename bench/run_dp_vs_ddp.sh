#!/usr/bin/env bash
# Data parallel: `dtrain train --strategy dp` (Gloo, and MPI) vs PyTorch 2.13's DistributedDataParallel
# (bench/gpt_ddp.py, Gloo, its default 25 MB buckets), zero1/zero2 vs DDP with ZeroRedundancyOptimizer, and
# zero3 (its default units, and one unit per block) vs FSDP2 (fully_shard on each block and the root), on
# the same GPT from the same initial weights, 2 ranks, same launcher and thread settings,
# alternating sides each round, at two sizes. Scaling efficiency: each round also runs one rank (one thread) on
# half the global batch (each rank's own work) for dtrain and for PyTorch, alone and, for the machine's ceiling,
# two such runs at the same time (2 ranks share 2 cores' memory bandwidth). Prints the markdown tables for
# bench/RESULTS.md. Build first.
# One process at 2 threads on the whole batch, dtrain against PyTorch, gives the one-rank comparison.
#   bash bench/run_dp_vs_ddp.sh [OUT_DIR]        (ROUNDS=3 STEPS=60 by default; DP_ONLY=1: dp, DDP and the
#                                                 scaling runs only, no ZeRO/FSDP rows)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/build/apps/dtrain:$PATH
out=${1:-bench/out/dp}
rounds=${ROUNDS:-3}
steps=${STEPS:-60}
mkdir -p "$out"
declare -A size=([small]="--layers 4 --width 128 --heads 4 --seq 64 --batch 16"
                 [medium]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16")
declare -A half=([small]="--layers 4 --width 128 --heads 4 --seq 64 --batch 8"
                 [medium]="--layers 4 --width 256 --heads 4 --seq 128 --batch 8")
solo() {  # one process: dtrain (side one / single) or PyTorch (ddp_one / ddp_single); THREADS; the model flags
  local side=$1 s=$2 tag=$3 threads=$4 model=$5
  if [ "${side#ddp_}" = "$side" ]; then
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads dtrain run -n 1 -- dtrain train $model --steps "$steps" --log-every 100000 \
      --metrics "$out/$side-$s-$tag.jsonl" > "$out/$side-$s-$tag.log" 2>&1
  else
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads dtrain run -n 1 --backend gloo -- .venv/bin/python bench/gpt_ddp.py $model \
      --steps "$steps" --metrics "$out/$side-$s-$tag.jsonl" > "$out/$side-$s-$tag.log" 2>&1
  fi
}
one_rank() { solo "$1" "$2" "$3" 1 "${half[$2]}"; }  # one thread, half the batch: each rank's own work
single() { solo "$1" "$2" "$3" 2 "${size[$2]}"; }    # 2 threads, the whole batch: the one-process comparison
# zero3 with a unit per block, as FSDP2's fully_shard per block (a block: 0.8 MB small, 3.2 MB medium)
declare -A block=([small]=1M [medium]=4M)
for s in small medium; do
  for r in $(seq "$rounds"); do
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 \
      --metrics "$out/dtrain-gloo-$s-$r.jsonl" > "$out/dtrain-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- .venv/bin/python bench/gpt_ddp.py ${size[$s]} --steps "$steps" \
      --metrics "$out/ddp-gloo-$s-$r.jsonl" > "$out/ddp-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend mpi -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 \
      --metrics "$out/dtrain-mpi-$s-$r.jsonl" > "$out/dtrain-mpi-$s-$r.log" 2>&1
    one_rank one "$s" "$r"
    one_rank ddp_one "$s" "$r"
    one_rank one "$s" "pair$r-a" & one_rank one "$s" "pair$r-b" & wait  # the ceiling: two at once
    single single "$s" "$r"
    single ddp_single "$s" "$r"
    [ -n "${DP_ONLY:-}" ] && continue
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 \
      --strategy zero1 --metrics "$out/zero1-gloo-$s-$r.jsonl" > "$out/zero1-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- .venv/bin/python bench/gpt_ddp.py ${size[$s]} --steps "$steps" --zero \
      --metrics "$out/zero_redundancy-gloo-$s-$r.jsonl" > "$out/zero_redundancy-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 \
      --strategy zero2 --metrics "$out/zero2-gloo-$s-$r.jsonl" > "$out/zero2-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- .venv/bin/python bench/gpt_ddp.py ${size[$s]} --steps "$steps" --fsdp \
      --metrics "$out/fsdp2-gloo-$s-$r.jsonl" > "$out/fsdp2-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 \
      --strategy zero3 --metrics "$out/zero3-gloo-$s-$r.jsonl" > "$out/zero3-gloo-$s-$r.log" 2>&1
    # shellcheck disable=SC2086
    dtrain run -n 2 --backend gloo -- dtrain train ${size[$s]} --steps "$steps" --log-every 100000 \
      --strategy zero3 --bucket-bytes "${block[$s]}" --metrics "$out/zero3_per_block-gloo-$s-$r.jsonl" \
      > "$out/zero3_per_block-gloo-$s-$r.log" 2>&1
  done
done
.venv/bin/python bench/report_dp.py "$out"
