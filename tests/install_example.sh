#!/usr/bin/env bash
# The example project (examples/trainer) built against an installed dtrain: `cmake --install` into a fresh
# prefix, the example configured outside the tree with only that prefix on CMAKE_PREFIX_PATH, built, and run
# by the installed `dtrain run` at 1 and 2 ranks (dp) and 2 ranks (zero2). The user's module must learn
# (held-out loss far below its start) and the 2-rank runs must end where the 1-rank run does (the same global
# batches: equal up to float summation order).
#   tests/install_example.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/dtrain-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/lib/cmake/dtrain/dtrainConfig.cmake"
test -f "$work/prefix/include/dtrain/train/trainer.h"
# the public headers only: no module's detail/ headers
if found=$(find "$work/prefix/include" -path '*/detail/*' | head -3) && [ -n "$found" ]; then
  echo "the installed tree holds internal headers: $found"; exit 1
fi
cmake -S "$src/examples/trainer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
run() {  # ranks strategy -> output file
  OMP_NUM_THREADS=1 "$work/prefix/bin/dtrain" run -n "$1" -- "$work/build/regression" "$2" >"$work/$1-$2.txt" 2>&1 ||
    { cat "$work/$1-$2.txt"; exit 1; }
  cat "$work/$1-$2.txt"
}
run 1 dp
run 2 dp
run 2 zero2
value() { grep -o "$2 [-0-9.e+]*" "$work/$1.txt" | tail -1 | awk '{print $NF}'; }
first=$(grep -o "step 50 loss [-0-9.e+]*" "$work/1-dp.txt" | awk '{print $NF}')
ref=$(value 1-dp "held-out loss")
python3 - "$first" "$ref" "$(value 2-dp "held-out loss")" "$(value 2-zero2 "held-out loss")" \
  "$(value 1-dp "sum of squares")" "$(value 2-dp "sum of squares")" "$(value 2-zero2 "sum of squares")" <<'PY'
import sys
first, ref, dp2, z2, sq1, sq2, sqz = map(float, sys.argv[1:])
assert ref < 0.2 * first, f"the example did not learn: held-out loss {ref} vs {first} at step 50"
for name, v in (("2 ranks dp", dp2), ("2 ranks zero2", z2)):
    assert abs(v - ref) <= 1e-4 * abs(ref), f"{name}: held-out loss {v} vs {ref} at 1 rank"
for name, v in (("2 ranks dp", sq2), ("2 ranks zero2", sqz)):
    assert abs(v - sq1) <= 1e-5 * abs(sq1), f"{name}: parameters' sum of squares {v} vs {sq1} at 1 rank"
print(f"install example: held-out loss {ref:.6g} (step 50: {first:.6g}); 2 ranks agree")
PY
