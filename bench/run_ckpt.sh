#!/usr/bin/env bash
# Issue 13's checkpoint bandwidth: dtrain's save and load of a GPT's whole training state (parameters and AdamW
# state, about 300 MB) at 1 and 2 ranks, beside this machine's sequential disk write and read speed measured in
# the same run with dd (write: conv=fdatasync, a file of the checkpoint's size; read: the checkpoint's own files,
# dropped from the page cache first), and PyTorch's torch.distributed.checkpoint (DDP's state dict and AdamW's) on the same model. Every read is timed with the
# files dropped from the page cache (drop_caches where writable, else posix_fadvise DONTNEED per file).
# Prints the markdown table for bench/RESULTS.md. Build first.
#   bash bench/run_ckpt.sh [OUT_DIR]        (ROUNDS=2 by default; the checkpoints go to OUT_DIR, on the disk measured)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/build/apps/dtrain:$PATH
export OMP_NUM_THREADS=1
out=${1:-bench/out/ckpt}
rounds=${ROUNDS:-2}
mkdir -p "$out"
out=$(cd "$out" && pwd)
size="--layers 8 --width 512 --heads 8 --seq 64 --batch 4"
evict() {  # drop files (or folders' files) from the page cache
  sync
  if { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then return; fi
  find "$@" -type f -print0 | xargs -0 .venv/bin/python -c \
    'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)'
}
seconds() {  # the first number after $2 in file $1
  grep -o "$2[^0-9]*[0-9.]*" "$1" | head -1 | grep -o '[0-9.]*$'
}
# SUMMARIZE_ONLY=1: print the tables of the rounds already in OUT_DIR/results.txt
[ "${SUMMARIZE_ONLY:-0}" = 1 ] || : > "$out/results.txt"
[ "${SUMMARIZE_ONLY:-0}" = 1 ] && rounds=0
for r in $(seq "$rounds"); do
  for n in 1 2; do
    d="$out/dtrain-$n"
    # this disk is mounted with online discard: a deletion's discards run at the next journal commit, and
    # slowed a save that came right after it by up to 2x here; sync lets them finish before anything is timed
    rm -rf "$d" "$out/dcp-$n"
    sync
    # shellcheck disable=SC2086
    dtrain run -n "$n" -- dtrain train $size --steps 1 --save "$d" > "$out/save-$n-$r.log" 2>&1
    bytes=$(du -sb "$d/step-00000001" | cut -f1)
    # the disk's read: dd over the checkpoint's own files (the same bytes at the same place on the disk), one
    # after the other, the cache dropped first, just before dtrain's load (both right after the save: reads
    # of a file just written ran up to 2x slower here than minutes later)
    evict "$d"
    t0=$(date +%s.%N)
    for f in "$d"/step-00000001/rank-*.safetensors; do dd if="$f" of=/dev/null bs=1M 2>/dev/null; done
    t1=$(date +%s.%N)
    ddr="$(cat "$d"/step-00000001/rank-*.safetensors | wc -c) bytes copied, $(awk "BEGIN {print $t1 - $t0}") s"
    evict "$d"
    # shellcheck disable=SC2086
    dtrain run -n "$n" -- dtrain train $size --steps 1 --resume "$d" > "$out/load-$n-$r.log" 2>&1
    save_s=$(seconds "$out/save-$n-$r.log" "saved to [^ ]* in")
    load_s=$(seconds "$out/load-$n-$r.log" "in")
    load_s=$(grep -o "resumed from [^ ]* (step 1) in [0-9.]*" "$out/load-$n-$r.log" | grep -o '[0-9.]*$')
    # shellcheck disable=SC2086
    dtrain run -n "$n" -- .venv/bin/python bench/gpt_ddp.py $size --steps 1 --dcp-save "$out/dcp-$n" \
      > "$out/dcp-save-$n-$r.log" 2>&1
    dcp_bytes=$(du -sb "$out/dcp-$n" | cut -f1)
    evict "$out/dcp-$n"
    # shellcheck disable=SC2086
    dtrain run -n "$n" -- .venv/bin/python bench/gpt_ddp.py $size --steps 1 --dcp-load "$out/dcp-$n" \
      > "$out/dcp-load-$n-$r.log" 2>&1
    dcp_save_s=$(grep -o "dcp_save_s [0-9.]*" "$out/dcp-save-$n-$r.log" | cut -d' ' -f2)
    dcp_load_s=$(grep -o "dcp_load_s [0-9.]*" "$out/dcp-load-$n-$r.log" | cut -d' ' -f2)
    # the disk, with a file of the checkpoint's size
    mb=$((bytes / 1048576 + 1))
    sync
    ddw=$( { dd if=/dev/zero of="$out/dd.bin" bs=1M count="$mb" conv=fdatasync 2>&1 >/dev/null; } | tail -1)
    rm -f "$out/dd.bin"
    echo "$r $n $bytes $save_s $load_s $dcp_bytes $dcp_save_s $dcp_load_s | $ddw | $ddr" >> "$out/results.txt"
  done
done
cat "$out/results.txt"
.venv/bin/python - "$out/results.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    head, ddw, ddr = line.split("|")
    r, n, b, s, l, db, ds, dl = head.split()
    def dd_seconds(text):
        return float(re.search(r"copied, ([0-9.]+) s", text).group(1)), int(text.split()[0])
    ws, wb = dd_seconds(ddw)
    rs, rb = dd_seconds(ddr)
    rows.setdefault(int(n), []).append(dict(bytes=int(b), save=float(s), load=float(l), dcp_bytes=int(db),
                                            dcp_save=float(ds), dcp_load=float(dl), ddw=wb / ws, ddr=rb / rs))
mb = 1e6
# Per rank: a save writes its 1/N of the state (replicas split the writing); a load under dp reads the whole
# state on every rank (each holds all of it). Aggregate: the bytes all ranks moved over the wall time, against
# the one dd stream.
# The disk's speed swings between rounds, so each round's own ratio (dtrain and dd a few seconds apart) is given
# too: its median and range over the rounds.
def per_round(rs, copies, key, dd):  # copies: of the state, moved by all ranks together
    ratios = sorted(copies * (x["bytes"] / mb) / x[key] / (x[dd] / mb) for x in rs)
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
print("| ranks | state (MB) | save: MB per rank | save (s) | per rank (MB/s) | all ranks (MB/s) | dd write (MB/s) | "
      "all / dd | per round: median (range) | PyTorch DCP save (s) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, rs in sorted(rows.items()):
    med = lambda k: statistics.median(x[k] for x in rs)
    per = med("bytes") / n / mb
    print(f"| {n} | {med('bytes') / mb:.0f} | {per:.0f} | {med('save'):.2f} | {per / med('save'):.0f} | "
          f"{per * n / med('save'):.0f} | {med('ddw') / mb:.0f} | {per * n / med('save') / (med('ddw') / mb):.2f} | "
          f"{per_round(rs, 1, 'save', 'ddw')} | {med('dcp_save'):.2f} |")
print()
print("| ranks | state (MB) | load: MB per rank | load (s) | per rank (MB/s) | all ranks (MB/s) | dd read (MB/s) | "
      "all / dd | per round: median (range) | PyTorch DCP load (s) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, rs in sorted(rows.items()):
    med = lambda k: statistics.median(x[k] for x in rs)
    per = med("bytes") / mb
    print(f"| {n} | {med('bytes') / mb:.0f} | {per:.0f} | {med('load'):.2f} | {per / med('load'):.0f} | "
          f"{per * n / med('load'):.0f} | {med('ddr') / mb:.0f} | {per * n / med('load') / (med('ddr') / mb):.2f} | "
          f"{per_round(rs, n, 'load', 'ddr')} | {med('dcp_load'):.2f} |")
PY
