#!/usr/bin/env bash
# The main job: set-up, build, then a distributed training run on real text: `dtrain train` (a GPT, one token per
# byte, on the fortunes text files) on 2 ranks, Horovod-style data parallel, OpenMPI on one machine (its shared
# memory moves all-reduces 3.6-9x faster than Gloo here: bench/RESULTS.md). The defaults below were chosen by
# measurement (bench/RESULTS.md, "The main job's defaults"): about five minutes of training on 2 cores.
# Arguments after the script go to `dtrain train` and override the defaults (a flag given twice takes its last
# value), e.g. `bash scripts/main.sh --steps 1000 --tp 2` (with DTRAIN_NPROC=4 for 4 ranks).
#   DTRAIN_BACKEND=gloo      Gloo instead of OpenMPI
#   DTRAIN_RUN_DIR=DIR       where the run's files go (default: runs/main-<date>-<time>; an existing run's
#                            folder is refused, never overwritten)
#   DTRAIN_SKIP_SETUP=1      skip set-up and build (the suite's test of this script, which also names the
#   DTRAIN_BIN_DIR=DIR       folder of the dtrain binary it built)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${DTRAIN_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh
  bash scripts/build.sh >/dev/null
fi
export PATH="${DTRAIN_BIN_DIR:-$PWD/build/apps/dtrain}:$PATH"
run="${DTRAIN_RUN_DIR:-runs/main-$(date +%Y%m%d-%H%M%S)}"
if [ -e "$run/train.log" ] || [ -e "$run/checkpoints" ]; then
  echo "main.sh: $run already holds a run; name another folder with DTRAIN_RUN_DIR." >&2
  exit 2
fi
mkdir -p "$run"
defaults=(--layers 4 --width 128 --heads 4 --seq 64 --batch 16 --steps 5000 --lr 6e-3 --lr-schedule cosine
  --warmup 200 --clip 1.0 --log-every 250 --eval-batches 16 --eval-every 1000 --sample 400 --save-every 1000)
dtrain run -n "${DTRAIN_NPROC:-2}" --backend "${DTRAIN_BACKEND:-mpi}" -- dtrain train "${defaults[@]}" \
  --metrics "$run/metrics.jsonl" --save "$run/checkpoints" --sample-file "$run/sample.txt" "$@" 2>&1 |
  tee "$run/train.log"
val=$(grep -o "validation loss [0-9.]*" "$run/train.log" | tail -1 | grep -o "[0-9.]*$" || true)
.venv/bin/python scripts/plot_loss.py "$run/metrics.jsonl" "$run/loss.png" ${val:+--val "$val"} \
  --title "dtrain main job: GPT on fortunes, ${DTRAIN_NPROC:-2} ranks" >/dev/null
echo
echo "main job: validation loss ${val:-?} nats per byte (the corpus's byte unigram entropy: 3.32, bigram: 2.59)"
if [ -s "$run/sample.txt" ]; then
  echo "sample of the trained model:"
  sed 's/^/  | /' "$run/sample.txt"
fi
echo "metrics:     $run/metrics.jsonl (one JSON object per step)"
echo "loss curve:  $run/loss.png"
echo "checkpoints: $run/checkpoints (dtrain ckpt inspect $run/checkpoints; --resume $run/checkpoints continues)"
echo "log:         $run/train.log"
