#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, build, then every test tier through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# One intra-op thread per rank on this 2-core machine (DESIGN §8); ranks must not outnumber cores by threads too.
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export PATH="$PWD/build/apps/dtrain:$PATH"
cd build
ctest --output-on-failure -j 2 "$@"
