"""Turns the JSON lines of bench/comm_vs_engine into the markdown tables of bench/RESULTS.md."""
import json
import sys


def human(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"


def main(paths):
    for path in paths:
        rows = [json.loads(line) for line in open(path) if line.strip()]
        head = next(r for r in rows if "memcpy_gbs_1thread" in r)
        print(f"\n### {head['backend']}, {head['ranks']} ranks (memcpy ceiling, 1 thread: "
              f"{head['memcpy_gbs_1thread']:.1f} GB/s read+written)\n")
        print("| op | size | dtrain median (us) | engine median (us) | dtrain busbw (GB/s) | engine busbw (GB/s) "
              "| ratio dtrain/engine |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            if "op" not in r:
                continue
            print(f"| {r['op']} | {human(r['bytes'])} | {r['dtrain_median_us']:.1f} | {r['engine_median_us']:.1f} "
                  f"| {r['dtrain_busbw_gbs']:.3f} | {r['engine_busbw_gbs']:.3f} | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
