#!/usr/bin/env bash
# Runs dtrain's collectives next to the engines' own calls (bench/comm_vs_engine.cpp) on both backends at 2 and 4
# ranks, and prints the markdown tables for bench/RESULTS.md. Build first (scripts/build.sh).
#   usage: bash bench/run_comm.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out}
mkdir -p "$out"
export PATH="$PWD/build/apps/dtrain:$PATH"
for backend in gloo mpi; do
  for n in 2 4; do
    echo "bench: $backend, $n ranks" >&2
    dtrain run -n "$n" --backend "$backend" -- build/bench/comm_vs_engine |
      sed -E 's/^(\[rank 0\] |\[1,0\]<stdout>:)//' | grep '^{' >"$out/comm_${backend}_${n}.jsonl"
  done
done
.venv/bin/python bench/report_comm.py "$out"/comm_*.jsonl
