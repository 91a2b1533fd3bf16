#!/usr/bin/env bash
# Per-op DTensor dispatch overhead: dtrain (C++ dispatch) and PyTorch's Python DTensor (Python dispatch) on the same
# ops, same thread settings, one after the other: on a 1-rank mesh, then Shard(0) on 2 ranks, where both sides
# redistribute for mm (dtrain with its redistributed-copy cache off, so that it gathers on every call as PyTorch
# does). Prints the markdown table for bench/RESULTS.md. Build first (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
dtrain=build/apps/dtrain/dtrain
strip() { sed -E 's/^\[rank 0\] //'; }
{
  build/bench/dtensor_overhead 2000
  .venv/bin/python bench/dtensor_overhead.py 2000
  DTRAIN_DTENSOR_CACHE_MB=0 $dtrain run -n 2 -- build/bench/dtensor_overhead 2000 | strip
  $dtrain run -n 2 -- .venv/bin/python bench/dtensor_overhead.py 2000 | strip
} | .venv/bin/python bench/report_dtensor_overhead.py
