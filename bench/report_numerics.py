"""Reads bench/run_numerics.sh's metrics files and logs; prints the markdown tables: median step time per side
(steps 10 and later of every round, pooled), mixed precision's bookkeeping per step and its share of the step,
the deterministic mode's cost, and activation checkpointing's peak memory and step time against PyTorch's."""
import glob
import os
import re
import statistics
import sys

from report_dp import peak, step_times


def median_ms(out, side):
    files = sorted(glob.glob(os.path.join(out, f"{side}-*.jsonl")))
    times = [x for f in files for x in step_times(f)]
    return statistics.median(times) * 1000 if times else float("nan")


def bookkeeping_ms(out, side):
    vals = []
    for log in sorted(glob.glob(os.path.join(out, f"{side}-*.log"))):
        m = re.search(r"mixed_precision_bookkeeping_ms_per_step ([\d.]+)", open(log).read())
        if m:
            vals.append(float(m.group(1)))
    return statistics.median(vals) if vals else float("nan")


def net_mib(out, side):
    vals = [peak(log)[1] for log in sorted(glob.glob(os.path.join(out, f"{side}-*.log")))]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else float("nan")


def main(out):
    fp32, ddp = median_ms(out, "fp32"), median_ms(out, "ddp")
    print("Mixed precision (dp, 2 ranks, small GPT):\n")
    print("| side | median step (ms) | ratio to dtrain fp32 | bookkeeping (ms/step) | share of its step | share of the fp32 step |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| PyTorch DDP fp32 | {ddp:.1f} | {ddp / fp32:.2f} | | | |")
    print(f"| dtrain fp32 | {fp32:.1f} | 1.00 | 0 | 0 | 0 |")
    for side in ("bf16", "bf16_reduce_fp32", "fp16"):
        t, b = median_ms(out, side), bookkeeping_ms(out, side)
        print(f"| dtrain {side.replace('_', ' ')} | {t:.1f} | {t / fp32:.2f} | {b:.3f} | {100 * b / t:.1f}% | {100 * b / fp32:.1f}% |")
    print("\nDeterministic mode (2 ranks, small GPT, the same rows per rank):\n")
    print("| strategy | median step (ms) | with --deterministic (ms) | cost |")
    print("|---|---:|---:|---:|")
    for s in ("dp", "zero3"):
        a, b = median_ms(out, f"{s}_nondet"), median_ms(out, f"{s}_det")
        print(f"| {s} | {a:.1f} | {b:.1f} | {100 * (b / a - 1):+.1f}% |")
    print("\nActivation checkpointing (dp, 2 ranks, GPT 4 x 128, sequence 256, batch 32):\n")
    print("| side | peak memory above start (MiB) | with checkpointing (MiB) | saved | median step (ms) | with checkpointing (ms) | time cost |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, side in (("dtrain", "acts_dtrain"), ("PyTorch DDP", "acts_ddp")):
        m0, m1 = net_mib(out, side), net_mib(out, f"{side}_ckpt")
        t0, t1 = median_ms(out, side), median_ms(out, f"{side}_ckpt")
        print(f"| {name} | {m0:.0f} | {m1:.0f} | {100 * (1 - m1 / m0):.0f}% | {t0:.1f} | {t1:.1f} | {100 * (t1 / t0 - 1):+.0f}% |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/numerics")
