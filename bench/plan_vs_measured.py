#!/usr/bin/env python3
"""The planner's predictions against measurements (bench/RESULTS.md, "Automatic planning").

For one model size: `dtrain run -n N -- dtrain plan MODEL --json` lists every candidate with its `flags`;
each candidate then trains MODEL + flags for --steps steps under `dtrain run -n N` with --metrics, and its
median step time over steps 10..steps (from elapsed_s) and its largest tensor_peak_mib (over steps and
ranks) are set against predicted_step_s and predicted_peak_mib. Prints a markdown table and the error
summary; --out writes every row as JSON lines.

  python3 bench/plan_vs_measured.py --ranks 2 --model "--layers 4 --width 128 --heads 4 --seq 64 --batch 16"
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return p.stdout


def measure(ranks, model, flags, steps, env, extra):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        run(["dtrain", "run", "-n", str(ranks), "--", "dtrain", "train", *model, *flags, "--steps", str(steps),
             "--log-every", "100000", "--metrics", metrics, *extra], env)
        rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    elapsed = {r["step"]: r["elapsed_s"] for r in rows}
    times = [elapsed[s] - elapsed[s - 1] for s in range(10, steps + 1) if s in elapsed and s - 1 in elapsed]
    peak = max(max(r.get("tensor_peak_mib", [0])) for r in rows)
    return statistics.median(times), peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--model", required=True, help="dtrain train's model and batch flags")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--plan-args", default="", help="more dtrain plan arguments (e.g. --memory-budget 20M)")
    ap.add_argument("--only", type=int, default=0, help="measure only the top K candidates (0: all)")
    ap.add_argument("--match", default="", help="measure only the candidates whose name contains this")
    ap.add_argument("--out", default="")
    ap.add_argument("--confirm", type=int, default=3,
                    help="then re-measure the chosen candidate and the K best measured ones in alternating rounds")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    model = shlex.split(a.model)
    plan = run(["dtrain", "run", "-n", str(a.ranks), "--", "dtrain", "plan", *model, *shlex.split(a.plan_args),
                "--json"], env)
    cands = [json.loads(l[l.index("{"):]) for l in plan.splitlines() if "{" in l]
    cands = [c for c in cands if c["fits"]] + [c for c in cands if not c["fits"]]
    if a.only:
        cands = cands[: a.only]
    if a.match:
        cands = [c for c in cands if a.match in c["name"]]
    out = open(a.out, "w") if a.out else None
    print(f"| rank | candidate | predicted ms | measured ms | error | predicted MiB | measured MiB | error |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    t_err, m_err, measured = [], [], []
    for c in cands:
        t, peak = measure(a.ranks, model, c["flags"], a.steps, env, [])
        measured.append((c, t))
        te = (c["predicted_step_s"] - t) / t
        me = (c["predicted_peak_mib"] - peak) / peak
        t_err.append(abs(te))
        m_err.append(abs(me))
        print(f"| {c['rank'] or '-'} | {c['name']} | {c['predicted_step_s']*1e3:.1f} | {t*1e3:.1f} | {te*100:+.1f}% "
              f"| {c['predicted_peak_mib']:.1f} | {peak:.1f} | {me*100:+.1f}% |", flush=True)
        if out:
            out.write(json.dumps({**c, "measured_step_s": t, "measured_peak_mib": peak}) + "\n")
            out.flush()
    print(f"\nstep time: median |error| {statistics.median(t_err)*100:.1f}%, largest {max(t_err)*100:.1f}%; "
          f"peak memory: median |error| {statistics.median(m_err)*100:.1f}%, largest {max(m_err)*100:.1f}% "
          f"({len(cands)} candidates, {a.ranks} ranks, steps 10..{a.steps})")
    if a.confirm and measured and any(c["chosen"] for c, _ in measured):
        # the choice: the chosen candidate and the best measured ones, re-measured in alternating rounds
        chosen = next(c for c, _ in measured if c["chosen"])
        best = [c for c, _ in sorted(measured, key=lambda x: x[1])[: a.confirm]]
        group = [chosen] + [c for c in best if c["name"] != chosen["name"]]
        times = {c["name"]: [] for c in group}
        for r in range(a.rounds):
            # the order turns round every other round, so that a drift over the rounds weighs on every candidate alike
            for c in (group if r % 2 == 0 else group[::-1]):
                times[c["name"]].append(measure(a.ranks, model, c["flags"], a.steps, env, [])[0])
        med = {k: statistics.median(v) for k, v in times.items()}
        fastest = min(med.values())
        print(f"\nthe choice, re-measured in {a.rounds} alternating rounds (median ms, rounds):")
        for c in group:
            v = times[c["name"]]
            print(f"- {c['name']}{' (chosen)' if c['chosen'] else ''}: {med[c['name']]*1e3:.1f} "
                  f"({', '.join(f'{x*1e3:.1f}' for x in v)})")
        print(f"chosen / fastest re-measured: {med[chosen['name']] / fastest:.3f} (medians of the rounds)")
        # paired: the chosen candidate against each other one round by round (the two ran next to each other, in
        # the same spell of the machine), then the median of those ratios; the worst of them is the choice's figure
        mine = times[chosen["name"]]
        paired = {k: statistics.median(x / y for x, y in zip(mine, v)) for k, v in times.items() if k != chosen["name"]}
        if paired:
            worst = max(paired, key=paired.get)
            print(f"chosen / each other, paired round by round (median of the rounds' ratios): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in paired.items()))
            print(f"chosen / fastest, paired: {max(1.0, paired[worst]):.3f} (against {worst})")

if __name__ == "__main__":
    main()
