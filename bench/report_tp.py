"""Reads bench/run_tp.sh's metrics files and logs; prints the markdown table: median step time per side and size
(steps 10 and later of every round, pooled), the ratio to PyTorch's DTensor tensor parallelism with the same
sequence-parallel setting, and the collectives of one step on each side (dtrain: its CommLog of the last step;
PyTorch: CommDebugMode over step 2's forward and backward)."""
import glob
import os
import re
import statistics
import sys

from report_dp import step_times


def collectives(log):
    text = open(log).read()
    m = re.search(r"collectives_per_step (\d+) (.*)", text)
    if m:
        return f"{m.group(1)} {m.group(2)}"
    counts = {}
    for n, kind in re.findall(r"\] [^:\n]+: (\d+) x (\w+), ", text):
        counts[kind] = counts.get(kind, 0) + int(n)
    return f"{sum(counts.values())} {counts}" if counts else "?"


def main(out):
    print("| size | ranks | side | median step (ms) | ratio to PyTorch TP | collectives per step |")
    print("|---|---:|---|---:|---:|---|")
    for size in ("small", "medium"):
        med = {}
        for side, peer, ranks in (("torch-tp", None, 2), ("dtrain-tp", "torch-tp", 2), ("torch-tp-sp", None, 2),
                                  ("dtrain-tp-sp", "torch-tp-sp", 2), ("torch-fsdp2xtp2", None, 4),
                                  ("dtrain-dp2xtp2", None, 4), ("dtrain-zero3xtp2", "torch-fsdp2xtp2", 4)):
            files = sorted(glob.glob(os.path.join(out, f"{side}-{size}-*.jsonl")))
            if not files:
                continue
            med[side] = statistics.median([x for f in files for x in step_times(f)]) * 1000
            ratio = f"{med[side] / med[peer]:.2f}" if peer in med else "(peer)"
            print(f"| {size} | {ranks} | {side} | {med[side]:.1f} | {ratio} | "
                  f"{collectives(files[0].replace('.jsonl', '.log'))} |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/tp")
