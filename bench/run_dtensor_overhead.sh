#!/usr/bin/env bash
# Per-op DTensor dispatch overhead: dtrain (C++) and PyTorch's Python DTensor on the same ops, same thread settings,
# one after the other; prints the markdown table for bench/RESULTS.md. Build first (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
{
  build/bench/dtensor_overhead 2000
  .venv/bin/python bench/dtensor_overhead.py 2000
} | .venv/bin/python bench/report_dtensor_overhead.py
