#!/usr/bin/env bash
# The main job: set-up, build, then a distributed training run on real text: `dtrain train` (a GPT, one token per
# byte, on the fortunes text files) on 2 ranks over Gloo, data parallel through DTensor. Arguments after the script
# go to `dtrain train`, e.g. `bash scripts/main.sh --steps 1000 --tp 2` (with DTRAIN_NPROC=4 for 4 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
export PATH="$PWD/build/apps/dtrain:$PATH"
exec dtrain run -n "${DTRAIN_NPROC:-2}" --backend "${DTRAIN_BACKEND:-gloo}" -- dtrain train "$@"
