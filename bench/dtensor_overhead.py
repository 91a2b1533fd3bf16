"""PyTorch's Python DTensor on the same ops as bench/dtensor_overhead.cpp: a 1-rank gloo mesh alone, or an N-rank
one under `dtrain run -n N` (torchrun's environment; Shard(0) only), 16x16 float32, one intra-op thread, best of
5 runs; rank 0 prints one JSON object per line."""
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def us_per_op(f, iters):
    for _ in range(iters // 10):
        f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    torch.set_num_threads(1)
    launched = "WORLD_SIZE" in os.environ
    store = tempfile.mktemp()
    if launched:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    ops = {"add": lambda x, y: x + y, "relu": lambda x, y: torch.relu(x), "mm": lambda x, y: torch.mm(x, y)}
    layouts = (("Replicate", Replicate()), ("Shard(0)", Shard(0))) if n == 1 else (("Shard(0)", Shard(0)),)
    for name, placement in layouts:
        da, db = distribute_tensor(a, mesh, [placement]), distribute_tensor(b, mesh, [placement])
        for op, fn in ops.items():
            plain = us_per_op(lambda: fn(a, b), iters)
            dt = us_per_op(lambda: fn(da, db), iters)
            if dist.get_rank() == 0:
                print(json.dumps({"tool": "pytorch-dtensor", "op": op, "layout": name, "plain_us": plain,
                                  "dtensor_us": dt, "overhead_us": dt - plain, "shape": "16x16", "iters": iters,
                                  "ranks": n}), flush=True)
    dist.destroy_process_group()
    os.remove(store) if os.path.exists(store) else None


if __name__ == "__main__":
    main()
