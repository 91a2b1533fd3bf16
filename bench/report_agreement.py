"""Markdown table of bench/agreement_cost.cpp results (one JSONL file per backend) for bench/RESULTS.md.

usage: python bench/report_agreement.py bench/out/agreement_*.jsonl
"""
import json
import sys


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


print("| backend | size | iterations | with check (us) | without (us) | overhead |")
print("|---|---:|---:|---:|---:|---:|")
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        print(f"| {r['backend']} | {size(r['bytes'])} | {r['iters']} | {r['with_check_median_us']:.1f} | "
              f"{r['without_check_median_us']:.1f} | {r['overhead_pct']:+.1f}% |")
