"""Sets two op-by-op profiles side by side (dtrain's DTRAIN_OP_PROFILE and bench/gpt_ddp.py --op-profile): per step,
each aten op's calls and self time on both sides, sorted by the difference, and what the ops do not account for
(the step time less the ops' self time: the language, the framework and the gaps between ops).

    python bench/compare_ops.py DTRAIN.json PYTORCH.json [--step-ms DTRAIN_MS PYTORCH_MS] [--top 25]
"""
import argparse
import json


def per_step(path):
    d = json.load(open(path))
    n = max(d["steps"], 1)
    return {k: (v["calls"] / n, v["self_us"] / n) for k, v in d["ops"].items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtrain")
    ap.add_argument("pytorch")
    ap.add_argument("--step-ms", type=float, nargs=2, help="the step times (ms) the profiles came from, unprofiled")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    d, p = per_step(a.dtrain), per_step(a.pytorch)
    aten = lambda m: {k: v for k, v in m.items() if k.startswith("aten::")}
    d, p = aten(d), aten(p)
    rows = []
    for k in set(d) | set(p):
        dc, du = d.get(k, (0, 0))
        pc, pu = p.get(k, (0, 0))
        rows.append((du - pu, k, dc, du, pc, pu))
    rows.sort(key=lambda r: -abs(r[0]))
    print("| aten op | dtrain calls/step | dtrain self us/step | PyTorch calls/step | PyTorch self us/step | dtrain - PyTorch (us) |")
    print("|---|---:|---:|---:|---:|---:|")
    for diff, k, dc, du, pc, pu in rows[: a.top]:
        print(f"| {k} | {dc:.0f} | {du:.0f} | {pc:.0f} | {pu:.0f} | {diff:+.0f} |")
    td, tp = sum(v[1] for v in d.values()), sum(v[1] for v in p.values())
    cd, cp = sum(v[0] for v in d.values()), sum(v[0] for v in p.values())
    print(f"| all aten ops | {cd:.0f} | {td:.0f} | {cp:.0f} | {tp:.0f} | {td - tp:+.0f} |")
    if a.step_ms:
        od, op = a.step_ms[0] * 1e3 - td, a.step_ms[1] * 1e3 - tp
        print(f"| outside aten ops (step time less the ops) | | {od:.0f} | | {op:.0f} | {od - op:+.0f} |")


if __name__ == "__main__":
    main()
