#!/usr/bin/env bash
# The main job: set-up, build, then a real multi-rank run. Until the trainer exists that is the collective benchmark
# on 2 ranks over Gloo (`dtrain run -n 2 -- dtrain bench comm`). Arguments after the script replace the defaults of
# `dtrain run`, e.g. `bash scripts/main.sh -n 3 --backend mpi`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
export PATH="$PWD/build/apps/dtrain:$PATH"
if (($#)); then
  exec dtrain run "$@" -- dtrain bench comm
fi
exec dtrain run -n 2 --backend gloo -- dtrain bench comm
