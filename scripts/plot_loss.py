"""The loss curve of a `dtrain train --metrics FILE` run, drawn with matplotlib: the training loss per step (and
its running mean), the learning rate on a second axis, and the validation losses the metrics hold (or --val).

    .venv/bin/python scripts/plot_loss.py METRICS.jsonl OUT.png [--val LOSS] [--title TEXT]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("out")
    ap.add_argument("--val", type=float, default=None, help="the validation loss at the end")
    ap.add_argument("--title", default="dtrain train")
    a = ap.parse_args()
    steps, loss, lr, val_steps, val = [], [], [], [], []
    with open(a.metrics) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if "val_loss" in r:  # an evaluation during (or at the end of) the run
                val_steps.append(r["step"])
                val.append(r["val_loss"])
                continue
            if r.get("loss") is None:
                continue
            steps.append(r["step"])
            loss.append(r["loss"])
            lr.append(r.get("lr"))
    if not steps:
        raise SystemExit(f"plot_loss: {a.metrics} holds no step")
    window = max(1, len(loss) // 50)
    mean = [sum(loss[max(0, i - window + 1): i + 1]) / len(loss[max(0, i - window + 1): i + 1])
            for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.plot(steps, loss, color="#9ecae1", linewidth=0.8, label="training loss (per step)")
    ax.plot(steps, mean, color="#08519c", linewidth=1.8, label=f"running mean ({window} steps)")
    if val:
        ax.plot(val_steps, val, color="#d62728", marker="o", linewidth=1, label="validation loss")
    elif a.val is not None:
        ax.scatter([steps[-1]], [a.val], color="#d62728", zorder=5, label=f"validation loss {a.val:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.grid(alpha=0.3)
    if any(v is not None for v in lr):
        ax2 = ax.twinx()
        ax2.plot(steps, [v if v is not None else float("nan") for v in lr], color="#ff7f0e", linewidth=1,
                 alpha=0.7, label="learning rate")
        ax2.set_ylabel("learning rate")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper right")
    else:
        ax.legend(loc="upper right")
    ax.set_title(a.title)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"plot_loss: {a.out}")


if __name__ == "__main__":
    main()
