"""Reads bench/run_dp_vs_ddp.sh's metrics files and logs; prints the markdown table: median step time per side
and size (steps 10 and later of every round, pooled), the ratio to DDP, and rank 0's peak resident memory."""
import glob
import json
import os
import re
import statistics
import sys


def step_times(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    t = [r["elapsed_s"] for r in rows if "elapsed_s" in r]  # not the evaluation rows (val_loss)
    return [b - a for a, b in zip(t[9:], t[10:])]


def peak(log):
    text = open(log).read()
    m = re.search(r"peak resident memory of rank 0: ([\d.]+) MiB", text) or re.search(r"peak_rss_mib ([\d.]+)", text)
    net = re.search(r"net_of_interpreter_mib ([\d.]+)", text) or re.search(r"MiB \(([\d.]+) MiB above its peak", text)
    return (float(m.group(1)) if m else float("nan")), (float(net.group(1)) if net else None)


def main(out):
    print("| size | side | median step (ms) | ratio to its PyTorch peer | peak RSS rank 0, MiB (net of the process once connected) |")
    print("|---|---|---:|---:|---:|")
    for size in ("small", "medium"):
        med = {}
        for side in ("ddp-gloo", "dtrain-gloo", "dtrain-mpi", "zero_redundancy-gloo", "zero1-gloo", "zero2-gloo",
                     "fsdp2-gloo", "zero3-gloo", "zero3_per_block-gloo"):
            files = sorted(glob.glob(os.path.join(out, f"{side}-{size}-*.jsonl")))
            if not files:
                continue
            times = [x for f in files for x in step_times(f)]
            med[side] = statistics.median(times) * 1000
            p, net = peak(files[0].replace(".jsonl", ".log"))
            mem = f"{p:.0f}" + (f" ({net:.0f} net)" if net is not None else "")
            peer = ("fsdp2-gloo" if side.startswith("zero3") else
                    "zero_redundancy-gloo" if side.startswith("zero") else "ddp-gloo")
            ratio = med[side] / med[peer] if peer in med else float("nan")
            print(f"| {size} | {side} | {med[side]:.1f} | {ratio:.2f} (to {peer}) | {mem} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/dp")
