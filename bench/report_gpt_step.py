"""Reads bench/gpt_step's JSON lines on stdin and prints the markdown table of bench/RESULTS.md."""
import json
import sys

print("| model (layers x width, batch x seq) | layout | plain ms/step | DTensor ms/step | ratio |")
print("|---|---|---|---|---|")
for line in sys.stdin:
    r = json.loads(line)
    m = r["model"]
    print(f"| {m['n_layer']} x {m['n_embd']}, {r['batch']} x {r['seq']} | {r['layout']} | "
          f"{r['plain_ms']:.2f} | {r['dtensor_ms']:.2f} | {r['ratio']:.3f} |")
