#!/usr/bin/env python3
"""The planner's topology on two simulated hosts (bench/RESULTS.md, "Automatic planning", topology).

Needs bench/topology_netns.sh up (root): 4 ranks, 2 on each of two network namespaces joined by a slowed
link. `dtrain plan MODEL PLAN_ARGS --json` runs as that job (the links measured inside a host and across
hosts, cached); the chosen candidate and its twin with the mesh's axes the other way round (--mesh-order)
then train MODEL + flags for --steps steps each, in alternating rounds, and their median step times over
steps 10..steps are set against the predictions. --pair also measures the fastest predicted candidate of
another kind (e.g. "tp2") against its twin. 2 cores run 4 ranks here: the figures are a record.

  python3 bench/plan_topology.py --model "--layers 4 --width 256 --heads 4 --seq 128 --batch 16" \\
      --plan-args "--memory-budget 60M" --pair tp2
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def on_hosts(args, env):
    p = subprocess.run(["bash", os.path.join(HERE, "topology_run.sh"), *args], env=env, capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-2000:])
        raise SystemExit(f"failed: {' '.join(args)}")
    return p.stdout


def measure(model, flags, steps, env):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        on_hosts(["train", *model, *flags, "--steps", str(steps), "--log-every", "100000", "--metrics", metrics],
                 env)
        rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    elapsed = {r["step"]: r["elapsed_s"] for r in rows}
    times = [elapsed[s] - elapsed[s - 1] for s in range(10, steps + 1) if s in elapsed and s - 1 in elapsed]
    return statistics.median(times)


def twin_of(c, cands):
    order = "" if c["mesh_order"] else ("tp,dp" if c["tp"] > 1 else "shard,replicate")
    keys = ("strategy", "tp", "sequence_parallel", "checkpoint_activations", "micro_batch", "accumulation",
            "bucket_bytes", "shard_size")
    for o in cands:
        if o["mesh_order"] == order and all(o[k] == c[k] for k in keys):
            return o
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="dtrain train's model and batch flags")
    ap.add_argument("--plan-args", default="", help="more dtrain plan arguments (e.g. --memory-budget 60M)")
    ap.add_argument("--pair", action="append", default=[],
                    help="also the fastest predicted candidate whose name contains this (e.g. tp2), and its twin")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    env = dict(os.environ)
    model = shlex.split(a.model)
    out = on_hosts(["plan", *model, *shlex.split(a.plan_args), "--json"], env)
    cands = [json.loads(l[l.index("{"):]) for l in out.splitlines() if "{" in l]
    chosen = next(c for c in cands if c["chosen"])
    pairs = [("chosen", chosen)]
    for p in a.pair:
        best = min((c for c in cands if c["fits"] and p in c["name"] and not c["mesh_order"]),
                   key=lambda c: c["predicted_step_s"], default=None)
        if best is not None and best is not chosen:
            pairs.append((p, best))
    print(f"plan: {len(cands)} candidates; chosen: {chosen['name']} (rank 1 of "
          f"{sum(1 for c in cands if c['fits'])} that fit)")
    runs = []
    for label, c in pairs:
        t = twin_of(c, cands)
        if t is None:
            print(f"{label}: {c['name']} has no mesh to lay out the other way (1-d): nothing to compare")
            continue
        runs.append((label, c, t))
    measured = {}
    for r in range(a.rounds):
        for label, c, t in runs:
            for x in (c, t) if r % 2 == 0 else (t, c):
                measured.setdefault(x["name"], []).append(measure(model, x["flags"], a.steps, env))
                print(f"  round {r + 1}: {x['name']}: {measured[x['name']][-1] * 1e3:.1f} ms", flush=True)
    print("\n| pair | candidate | its heavy axis | predicted step (ms) | measured median step (ms) |")
    print("|---|---|---|---:|---:|")
    for label, c, t in runs:
        for x in (c, t):
            where = "across hosts" if x["mesh_order"] else "inside a host"
            m = statistics.median(measured[x["name"]])
            print(f"| {label} | `{x['name']}` | {where} | {x['predicted_step_s'] * 1e3:.1f} | {m * 1e3:.1f} |")
        ratio = statistics.median(measured[t["name"]]) / statistics.median(measured[c["name"]])
        print(f"| {label} | twin / planned | | {t['predicted_step_s'] / c['predicted_step_s']:.3f} | "
              f"{ratio:.3f} |")


if __name__ == "__main__":
    main()
