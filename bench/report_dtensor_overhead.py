"""Turns the JSON lines of bench/dtensor_overhead(.py) into the markdown table of bench/RESULTS.md."""
import json
import sys


def main():
    rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    key = lambda r: (r.get("ranks", 1), r["layout"], r["op"])
    ours = {key(r): r for r in rows if r["tool"] == "dtrain"}
    theirs = {key(r): r for r in rows if r["tool"] == "pytorch-dtensor"}
    print("| op (16x16 fp32) | ranks | layout | plain libtorch, C++ (us) | dtrain DTensor, C++ dispatch (us) "
          "| dtrain overhead (us) | plain via Python (us) | PyTorch DTensor, Python dispatch (us) "
          "| PyTorch overhead (us) | overhead PyTorch / dtrain |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for k, o in ours.items():
        t = theirs[k]
        print(f"| {k[2]} | {k[0]} | {k[1]} | {o['plain_us']:.2f} | {o['dtensor_us']:.2f} | {o['overhead_us']:.2f} "
              f"| {t['plain_us']:.2f} | {t['dtensor_us']:.2f} | {t['overhead_us']:.2f} "
              f"| {t['overhead_us'] / o['overhead_us']:.1f} |")


if __name__ == "__main__":
    main()
