"""Markdown table of bench/agreement_cost.cpp results (one JSONL file per backend) for bench/RESULTS.md.

One row per backend and size over the rounds of the run: the medians of the calls with and without the check
(median over rounds), the paired overhead (median over rounds of each round's median paired difference) and the
range of the paired overhead across rounds.

An A/A run (agreement_cost --aa 1: the check on both sides) is labelled "<backend> A/A": its "paired overhead" is
what the machine's noise alone gives the paired figure.

usage: python bench/report_agreement.py bench/out/agreement_*.jsonl
"""
import collections
import json
import statistics
import sys


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


print("| backend | size | rounds x iterations | with check (us) | without (us) | paired overhead | "
      "range over rounds | fastest with / without (us) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for path in sys.argv[1:]:
    rows = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        rows[(r["backend"] + (" A/A" if r.get("mode", "").startswith("A/A") else ""), r["bytes"])].append(r)
    for (backend, b), rs in rows.items():
        med = lambda k: statistics.median(r[k] for r in rs)
        paired = [r["paired_overhead_pct"] for r in rs]
        print(f"| {backend} | {size(b)} | {len(rs)} x {rs[0]['iters']} | {med('with_check_median_us'):.1f} | "
              f"{med('without_check_median_us'):.1f} | {statistics.median(paired):+.1f}% | "
              f"{min(paired):+.1f}% to {max(paired):+.1f}% | "
              f"{min(r['with_check_min_us'] for r in rs):.0f} / {min(r['without_check_min_us'] for r in rs):.0f} |")
