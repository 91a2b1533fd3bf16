"""Reads bench/run_dp_vs_ddp.sh's metrics files and logs; prints the markdown tables: median step time per side
and size (steps 10 and later of every round, pooled), the ratio to DDP, and rank 0's peak resident memory; then
scaling efficiency per round (one rank on half the batch / the 2-rank step), the machine's ceiling (one such run
alone / two at once) and the efficiency counted against it, as the median over rounds with their range."""
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
    scaling(out)


def median_step(path):
    return statistics.median(step_times(path)) if os.path.exists(path) else float("nan")


def spread(values):
    v = [x for x in values if x == x]
    if not v:
        return "n/a"
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"


def scaling(out):
    singles = []
    print()
    print("| size | rounds | ceiling: 1 rank alone / two at once | dtrain gloo: efficiency (against the ceiling) | "
          "dtrain mpi | PyTorch DDP | dtrain gloo / DDP | dtrain mpi / DDP |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in ("small", "medium"):
        rounds = sorted(int(p.rsplit("-", 1)[1].split(".")[0])
                        for p in glob.glob(os.path.join(out, f"one-{size}-*.jsonl")) if "pair" not in p)
        if not rounds:
            continue
        ceil, eff, ratio = [], {k: [] for k in ("dtrain-gloo", "dtrain-mpi", "ddp-gloo")}, {"dtrain-gloo": [], "dtrain-mpi": []}
        for r in rounds:
            one = median_step(os.path.join(out, f"one-{size}-{r}.jsonl"))
            ddp_one = median_step(os.path.join(out, f"ddp_one-{size}-{r}.jsonl"))
            pair = [median_step(os.path.join(out, f"one-{size}-pair{r}-{x}.jsonl")) for x in "ab"]
            ceil.append(one / max(pair))
            two = {k: median_step(os.path.join(out, f"{k}-{size}-{r}.jsonl")) for k in eff}
            eff["dtrain-gloo"].append(one / two["dtrain-gloo"])
            eff["dtrain-mpi"].append(one / two["dtrain-mpi"])
            eff["ddp-gloo"].append(ddp_one / two["ddp-gloo"])
            for k in ratio:
                ratio[k].append(two[k] / two["ddp-gloo"])
        single = [median_step(os.path.join(out, f"single-{size}-{r}.jsonl")) /
                  median_step(os.path.join(out, f"ddp_single-{size}-{r}.jsonl")) for r in rounds]
        singles.append((size, spread(single)))
        c = statistics.median(ceil)
        cells = [f"{spread(eff[k])} ({statistics.median(eff[k]) / c:.2f})" for k in ("dtrain-gloo", "dtrain-mpi", "ddp-gloo")]
        print(f"| {size} | {len(rounds)} | {spread(ceil)} | {' | '.join(cells)} | {spread(ratio['dtrain-gloo'])} | "
              f"{spread(ratio['dtrain-mpi'])} |")
    print()
    print("| size | one process, 2 threads: dtrain / PyTorch (median over rounds, range) |")
    print("|---|---:|")
    for size, cell in singles:
        print(f"| {size} | {cell} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/dp")
