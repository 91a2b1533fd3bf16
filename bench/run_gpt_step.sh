#!/usr/bin/env bash
# A GPT training step with DTensor parameters on a 1-rank mesh vs. plain libtorch (bench/gpt_step.cpp), on a
# small and a medium model, one intra-op thread; prints the markdown table for bench/RESULTS.md. Build first
# (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
{
  build/bench/gpt_step 60 2 64 4 32     # small: dispatch overhead is the largest share
  build/bench/gpt_step 12 4 256 8 128   # medium
} | .venv/bin/python bench/report_gpt_step.py
