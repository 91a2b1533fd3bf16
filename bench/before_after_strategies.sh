#!/usr/bin/env bash
# A restructuring's before and after: `dtrain train` of two builds side by side, 2 ranks on Gloo, the small GPT
# under dp, zero1, zero2 and zero3 and the medium GPT under dp and zero3, alternating the builds run by run, 3
# rounds; prints each side's median step (steps 10 onwards, median over the rounds, each round's figure) and
# the ratio. BEFORE: the `dtrain` binary of the earlier build (copy it aside before rebuilding).
#   BEFORE=/tmp/before/bin/dtrain bash bench/before_after_strategies.sh [OUT_DIR]
set -u
cd "$(dirname "$0")/.."
before=${BEFORE:?set BEFORE to the dtrain binary of the earlier build}
after=$PWD/build/apps/dtrain/dtrain
out=${1:-bench/out/before_after}; rm -rf "$out"; mkdir -p "$out"
S="--layers 4 --width 128 --heads 4 --seq 64 --batch 16"
M="--layers 4 --width 256 --heads 4 --seq 128 --batch 16"
for r in 1 2 3; do
  for st in dp zero1 zero2 zero3; do
    for side in before after; do
      if [ $side = before ]; then B=$before; else B=$after; fi
      OMP_NUM_THREADS=1 $B run -n 2 --backend gloo -- $B train $S --strategy $st --steps 60 --log-every 100000 --metrics $out/$side-small-$st-$r.jsonl > $out/$side-small-$st-$r.log 2>&1
    done
  done
  for st in dp zero3; do
    for side in before after; do
      if [ $side = before ]; then B=$before; else B=$after; fi
      OMP_NUM_THREADS=1 $B run -n 2 --backend gloo -- $B train $M --strategy $st --steps 40 --log-every 100000 --metrics $out/$side-medium-$st-$r.jsonl > $out/$side-medium-$st-$r.log 2>&1
    done
  done
done
python3 - "$out" <<'PY'
import json,glob,statistics,collections,sys
res=collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + '/*.jsonl'):
    name=f.split('/')[-1][:-6]; side,size,st,r=name.split('-')
    el=[json.loads(l)['elapsed_s'] for l in open(f) if '"loss"' in l]
    d=[b-a for a,b in zip(el,el[1:])][9:]
    res[(size,st,side)].append(statistics.median(d)*1000)
for size in ['small','medium']:
  for st in ['dp','zero1','zero2','zero3']:
    b=res.get((size,st,'before')); a=res.get((size,st,'after'))
    if not b: continue
    print(f"{size:6s} {st:6s} before {statistics.median(b):7.2f} ms {[round(x,1) for x in b]}  after {statistics.median(a):7.2f} ms {[round(x,1) for x in a]}  after/before {statistics.median(a)/statistics.median(b):.3f}")
PY
