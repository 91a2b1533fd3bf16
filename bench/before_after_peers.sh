#!/usr/bin/env bash
# A restructuring's before and after against the PyTorch peers, as bench/run_dp_vs_ddp.sh and bench/run_tp.sh
# measure them: dp vs DistributedDataParallel, zero1 vs ZeroRedundancyOptimizer, zero3 vs FSDP2 and --tp 2 vs
# PyTorch's DTensor tensor parallelism, at both sizes, 2 ranks on Gloo, the same launcher and thread settings.
# Each round runs the peer once and both dtrain builds, the builds' order alternating round by round, so that
# before and after are measured in one sitting. Prints each pair's ratio to its peer before and after (median
# over the rounds, and each round's), and after/before. BEFORE: the `dtrain` binary of the earlier build.
#   BEFORE=/tmp/before/bin/dtrain bash bench/before_after_peers.sh [OUT_DIR]     (ROUNDS=3 STEPS=60 by default;
#   SIZES="small medium" and PAIRS="dp zero1 zero3 tp" select a part)
set -u
cd "$(dirname "$0")/.."
before=${BEFORE:?set BEFORE to the dtrain binary of the earlier build}
after=$PWD/build/apps/dtrain/dtrain
out=${1:-bench/out/before_after_peers}; rm -rf "$out"; mkdir -p "$out"
rounds=${ROUNDS:-3}
steps=${STEPS:-60}
declare -A size=([small]="--layers 4 --width 128 --heads 4 --seq 64 --batch 16"
                 [medium]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16")
# pair: dtrain's flags | the peer's flags (bench/gpt_ddp.py)
declare -A dtrain_flags=([dp]="--strategy dp" [zero1]="--strategy zero1" [zero3]="--strategy zero3" [tp]="--tp 2")
declare -A peer_flags=([dp]="" [zero1]="--zero" [zero3]="--fsdp" [tp]="--tp 2")
run_dtrain() {  # side binary size pair round
  # shellcheck disable=SC2086
  "$2" run -n 2 --backend gloo -- "$2" train ${size[$3]} ${dtrain_flags[$4]} --steps "$steps" \
    --log-every 100000 --metrics "$out/$1-$3-$4-$5.jsonl" > "$out/$1-$3-$4-$5.log" 2>&1
}
for r in $(seq "$rounds"); do
  for s in ${SIZES:-small medium}; do
    for p in ${PAIRS:-dp zero1 zero3 tp}; do
      # shellcheck disable=SC2086
      "$after" run -n 2 --backend gloo -- .venv/bin/python bench/gpt_ddp.py ${size[$s]} \
        ${peer_flags[$p]} --steps "$steps" --metrics "$out/peer-$s-$p-$r.jsonl" > "$out/peer-$s-$p-$r.log" 2>&1
      if [ $((r % 2)) = 1 ]; then
        run_dtrain before "$before" "$s" "$p" "$r"; run_dtrain after "$after" "$s" "$p" "$r"
      else
        run_dtrain after "$after" "$s" "$p" "$r"; run_dtrain before "$before" "$s" "$p" "$r"
      fi
    done
  done
done
python3 - "$out" <<'PY'
import json, glob, statistics, collections, sys
step = {}
for f in glob.glob(sys.argv[1] + '/*.jsonl'):
    side, size, pair, r = f.split('/')[-1][:-6].split('-')
    el = [json.loads(l)['elapsed_s'] for l in open(f) if '"loss"' in l and 'elapsed_s' in l]
    d = [b - a for a, b in zip(el, el[1:])][9:]
    if d:
        step[(side, size, pair, r)] = statistics.median(d)
names = {'dp': 'dp / DDP', 'zero1': 'zero1 / ZeroRedundancyOptimizer', 'zero3': 'zero3 / FSDP2', 'tp': 'tp 2 / PyTorch TP'}
print('| pair | size | before: dtrain / peer | after: dtrain / peer | after / before |')
print('|---|---|---|---|---|')
for pair in ['dp', 'zero1', 'zero3', 'tp']:
    for size in ['small', 'medium']:
        ratios = collections.defaultdict(list)
        rounds = sorted({k[3] for k in step if k[1] == size and k[2] == pair})
        for r in rounds:
            peer = step.get(('peer', size, pair, r))
            for side in ['before', 'after']:
                mine = step.get((side, size, pair, r))
                if peer and mine:
                    ratios[side].append(mine / peer)
        if not ratios['before'] or not ratios['after']:
            continue  # (not selected, or a run failed: see its .log)
        b, a = statistics.median(ratios['before']), statistics.median(ratios['after'])
        fmt = lambda xs: ', '.join(f'{x:.2f}' for x in xs)
        print(f'| {names[pair]} | {size} | {b:.2f} ({fmt(ratios["before"])}) | {a:.2f} ({fmt(ratios["after"])}) | {a / b:.2f} |')
PY
