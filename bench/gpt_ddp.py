"""PyTorch's peer of `dtrain train --strategy dp` (and, with --zero, of zero1: ZeroRedundancyOptimizer): the same GPT as models::GPT (token + position embedding,
pre-LayerNorm blocks with separate q, k, v projections, causal SDPA, a GELU MLP 4x wide, final LayerNorm, head
tied to the token embedding), trained with AdamW under torch's DistributedDataParallel (its defaults: 25 MB
buckets), Gloo, each rank on its rows of the global batch. Started by `dtrain run -n N -- python bench/gpt_ddp.py`
(RANK, WORLD_SIZE, MASTER_ADDR/PORT and the thread variables come from the launcher). Writes the same metrics as
`dtrain train --metrics`: one JSON object per step with step, loss and elapsed_s; prints peak resident memory.
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.q, self.k, self.v, self.proj = (nn.Linear(c, c) for _ in range(4))
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def attn(self, x):
        b, t, c = x.shape
        heads = lambda y: y.view(b, t, self.h, c // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, heads, width):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():  # as models::GPT: normal(0, 0.02), biases 0, LayerNorm 1/0
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):  # the mean loss, so that DDP's forward sees the whole step
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def same_weights_as_dtrain(model, seed):
    """models::GPT's initial values (models::GPTInit): one generator seeded with `seed`, normal(0, 0.02) drawn
    for each weight in models::GPT's registration order (wte, wpe, then per block ln1, q, k, v, proj, ln2, fc,
    proj, then ln_f), biases 0, LayerNorm 1/0; the same libtorch draws the same numbers."""
    order = ["wte.weight", "wpe.weight"]
    for i in range(len(model.blocks)):
        for m in ("ln1", "q", "k", "v", "proj", "ln2", "fc", "fc_proj"):
            order += [f"blocks.{i}.{m}.weight", f"blocks.{i}.{m}.bias"]
    order += ["ln_f.weight", "ln_f.bias"]
    params = dict(model.named_parameters())
    assert sorted(order) == sorted(params), "the parameter lists differ"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in order:
            p = params[name]
            if "ln" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--metrics", default="")
    ap.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (optimizer state sharded) under DDP")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2: fully_shard on each block and the root (ZeRO-3's peer)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the interpreter and torch
    torch.manual_seed(a.seed)
    model = GPT(256, a.seq, a.layers, a.heads, a.width)
    same_weights_as_dtrain(model, a.seed)
    if rank == 0:  # dtrain train prints the same fingerprint of its initial weights
        print(f"initial sum of squares {sum(p.detach().double().pow(2).sum().item() for p in model.parameters()):.9g}")
    if a.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (n,))
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        ddp = fully_shard(model, mesh=mesh)
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    rows = [a.batch // n + (1 if r < a.batch % n else 0) for r in range(n)]
    start = sum(rows[:rank])
    out = open(a.metrics, "w") if a.metrics and rank == 0 else None
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        g = torch.Generator().manual_seed(step)
        w = torch.randint(256, (a.batch, a.seq + 1), generator=g)[start : start + rows[rank]]
        opt.zero_grad()
        loss = ddp(w[:, :-1], w[:, 1:]) * (rows[rank] * n / a.batch)  # uneven rows weighted, as dtrain does
        loss.backward()
        opt.step()
        if out:
            out.write(json.dumps({"step": step, "loss": loss.item(), "elapsed_s": time.perf_counter() - t0}) + "\n")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if rank == 0:
        print(f"peak_rss_mib {peak_kib / 1024:.1f} net_of_interpreter_mib {(peak_kib - rss_before_kib) / 1024:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
