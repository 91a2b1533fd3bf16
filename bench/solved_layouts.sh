#!/usr/bin/env bash
# The solved layout (`--strategy solve`) beside the hand-written ones on the small GPT at 2 ranks, in one run:
# throughput at the last step, collectives and bytes of the last step (CommLog, as `dtrain train` prints it),
# the solver's prediction. bench/RESULTS.md, "Solved layouts".
#   bench/solved_layouts.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build=${1:-build}
dtrain=$build/apps/dtrain/dtrain
work=$(mktemp -d /tmp/dtrain-solved.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
# The links' profile, measured here first: the solver prices collectives by it.
"$dtrain" run -n 2 -- "$dtrain" bench comm --profile "$work/profile.json" >/dev/null 2>&1
export DTRAIN_COMM_PROFILE=$work/profile.json
model="--layers 4 --width 128 --heads 4 --seq 64 --batch 16 --steps 30 --log-every 10 --eval-batches 1"
run() {  # name, flags...
  local name=$1
  shift
  "$dtrain" run -n 2 -- "$dtrain" train $model "$@" >"$work/$name.txt" 2>&1 || { cat "$work/$name.txt"; exit 1; }
  python3 - "$name" "$work/$name.txt" <<'PY'
import re, sys
name, path = sys.argv[1], sys.argv[2]
text = [l for l in open(path) if not l.startswith("[rank 1]")]
rate = [float(m.group(1)) for l in text for m in [re.search(r"step +30 +loss .* (\d+) tokens/s", l)] if m]
n = b = 0
for l in text:
    m = re.search(r": (\d+) x (all_reduce|all_gather|reduce_scatter|all_to_all|broadcast), (\d+) B", l)
    if m:
        n += int(m.group(1)); b += int(m.group(3))
plan = [l.split("strategy solve on a ")[1].strip() for l in text if "strategy solve on a " in l]
print(f"{name:28s} {rate[-1] if rate else float('nan'):8.0f} tokens/s  step {16*64/rate[-1]*1000 if rate else 0:6.1f} ms  "
      f"{n:3d} collectives  {b/2**20:6.2f} MiB" + (f"\n    plan: {plan[0]}" if plan else ""))
PY
}
run dp --strategy dp
run zero3 --strategy zero3
run "tp 2 (Megatron)" --tp 2
run "solve" --strategy solve
run "solve, budget 12M" --strategy solve --solve-budget 12M
run "solve, budget 12M, batch free" --strategy solve --solve-budget 12M --solve-batch-axis -1
