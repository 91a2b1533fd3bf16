#!/usr/bin/env bash
# Re-measures every figure of bench/RESULTS.md in one go, section by section, into OUTDIR (default bench/out):
# the focused 64 MiB all_reduce (3 runs per backend), every collective at 2 and 4 ranks (run_comm.sh), `dtrain
# bench comm` at 3 ranks, the agreement check's cost, the DTensor dispatch overhead and the GPT step. Build first (scripts/build.sh). About 8-10
# minutes on 2 cores; run nothing else meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out}
mkdir -p "$out"
export PATH="$PWD/build/apps/dtrain:$PATH"
strip() { sed -E 's/^(\[rank 0\] |\[1,0\]<stdout>:)//'; }
git rev-parse --short HEAD >"$out/commit.txt"
: >"$out/allreduce_64mib.jsonl"
for b in gloo mpi; do
  for k in 1 2 3; do
    dtrain run -n 2 --backend $b -- build/bench/comm_vs_engine --ops all_reduce --min-bytes 67108864 \
      --max-bytes 67108864 --iters 30 | strip | grep '"op"' >>"$out/allreduce_64mib.jsonl"
  done
done
bash bench/run_comm.sh "$out" >"$out/comm_tables.md"
for b in gloo mpi; do
  dtrain run -n 3 --backend $b -- dtrain bench comm | strip >"$out/bench_comm_${b}_3.txt"
done
for b in gloo mpi; do
  dtrain run -n 2 --backend $b -- build/bench/agreement_cost | strip | grep '"overhead_pct"' >"$out/agreement_${b}.jsonl"
done
.venv/bin/python bench/report_agreement.py "$out"/agreement_gloo.jsonl "$out"/agreement_mpi.jsonl >"$out/agreement.md"
bash bench/run_dtensor_overhead.sh >"$out/dtensor_overhead.md"
bash bench/run_gpt_step.sh >"$out/gpt_step.md"
echo "bench: results in $out (commit $(cat "$out/commit.txt"))" >&2
