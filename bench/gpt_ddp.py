"""PyTorch's peer of `dtrain train --strategy dp` (and, with --zero, of zero1: ZeroRedundancyOptimizer; with --fsdp
of zero3: FSDP2; with --tp N of `dtrain train --tp N`: DTensor tensor parallelism, --sp adding sequence parallel): the same GPT as models::GPT (token + position embedding,
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
import sys
import time

import torch
import torch.utils.checkpoint
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
        hd = c // self.h  # heads from the projections' width: under tensor parallel each rank has some of them
        heads = lambda y: y.view(b, t, -1, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, heads, width):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.checkpoint = False
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
            # --checkpoint: torch.utils.checkpoint per block (non-reentrant), as dtrain's --checkpoint-activations
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x)
        h = self.ln_f(x)
        if hasattr(h, "full_tensor"):  # sequence parallel: the whole sequence for the (replicated) head
            h = h.full_tensor()
        logits = F.linear(h, self.wte.weight)
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


def tensor_parallel(model, n, tp, sp):
    """PyTorch 2.13's DTensor tensor parallelism on a (dp, tp) mesh: colwise q, k, v and fc, rowwise projections
    (embedding and tied head replicated); with sp, LayerNorms SequenceParallel and the sequence split at the first
    block (PyTorch's tutorial layout); data parallel over dp with DDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    mesh = init_device_mesh("cpu", (n // tp, tp), mesh_dim_names=("dp", "tp"))
    for i, b in enumerate(model.blocks):
        if sp:
            plan = {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                    "q": ColwiseParallel(input_layouts=Shard(1)), "k": ColwiseParallel(input_layouts=Shard(1)),
                    "v": ColwiseParallel(input_layouts=Shard(1)), "fc": ColwiseParallel(input_layouts=Shard(1)),
                    "proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                    "fc_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
        else:
            plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "fc": ColwiseParallel(),
                    "proj": RowwiseParallel(), "fc_proj": RowwiseParallel()}
        parallelize_module(b, mesh["tp"], plan)
    if sp:
        parallelize_module(model, mesh["tp"], {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=False),
            "ln_f": SequenceParallel()})
    if n // tp > 1:  # 2-d: FSDP2 over dp (DDP does not take DTensor parameters)
        from torch.distributed.fsdp import fully_shard

        for b in model.blocks:
            fully_shard(b, mesh=mesh["dp"])
        return fully_shard(model, mesh=mesh["dp"])
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--metrics", default="")
    ap.add_argument("--op-profile", default="", help="write an op-by-op CPU profile of the steps after the second (JSON, as dtrain's DTRAIN_OP_PROFILE)")
    ap.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (optimizer state sharded) under DDP")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2: fully_shard on each block and the root (ZeRO-3's peer)")
    ap.add_argument("--tp", type=int, default=1, help="DTensor tensor parallel: colwise q/k/v and fc, rowwise projections")
    ap.add_argument("--sp", action="store_true", help="with --tp: sequence parallel (LayerNorms on the local sequence)")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dcp-save", default="", help="after training, save model and optimizer state with torch.distributed.checkpoint (DDP only)")
    ap.add_argument("--dcp-load", default="", help="after training, load model and optimizer state saved by --dcp-save (DDP only)")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the interpreter and torch
    torch.manual_seed(a.seed)
    model = GPT(256, a.seq, a.layers, a.heads, a.width)
    same_weights_as_dtrain(model, a.seed)
    model.checkpoint = a.checkpoint
    if rank == 0:  # dtrain train prints the same fingerprint of its initial weights
        print(f"initial sum of squares {sum(p.detach().double().pow(2).sum().item() for p in model.parameters()):.9g}")
    if a.tp > 1:
        ddp = tensor_parallel(model, n, a.tp, a.sp)
    elif a.fsdp:
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
    ndp, dp_rank = n // a.tp, rank // a.tp  # the ranks of a tensor-parallel group take the same rows
    rows = [a.batch // ndp + (1 if r < a.batch % ndp else 0) for r in range(ndp)]
    start = sum(rows[:dp_rank])
    out = open(a.metrics, "w") if a.metrics and rank == 0 else None
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        g = torch.Generator().manual_seed(step)
        w = torch.randint(256, (a.batch, a.seq + 1), generator=g)[start : start + rows[dp_rank]]
        opt.zero_grad()
        count = step == 2 and a.tp > 1 and rank == 0
        if count:  # the collectives of one step (forward and backward), as dtrain's CommLog counts them
            from torch.distributed.tensor.debug import CommDebugMode

            mode = CommDebugMode()
            mode.__enter__()
        loss = ddp(w[:, :-1], w[:, 1:]) * (rows[dp_rank] * ndp / a.batch)  # uneven rows weighted, as dtrain does
        loss.backward()
        if count:
            mode.__exit__(None, None, None)
            print(f"collectives_per_step {mode.get_total_counts()} {dict((str(k).split('.')[-1], v) for k, v in mode.get_comm_counts().items())}")
        opt.step()
        if a.op_profile and step == 2:  # the first two steps warm up, as in dtrain's profile
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        if out:
            out.write(json.dumps({"step": step, "loss": loss.item(), "elapsed_s": time.perf_counter() - t0}) + "\n")
    if a.op_profile and a.steps > 2:
        prof.__exit__(None, None, None)
        if rank == 0:
            ops = {e.key: {"calls": e.count, "self_us": e.self_cpu_time_total} for e in prof.key_averages()}
            with open(a.op_profile, "w") as f:
                json.dump({"tool": "pytorch", "steps": a.steps - 2, "ops": ops}, f, indent=1)
    if a.dcp_save or a.dcp_load:  # PyTorch's peer of dtrain's checkpoints (bench/run_ckpt.sh)
        import torch.distributed.checkpoint as dcp

        state = {"model": ddp.state_dict(), "optim": opt.state_dict()}
        dist.barrier()
        t = time.perf_counter()
        if a.dcp_save:
            dcp.save(state, checkpoint_id=a.dcp_save)
        else:
            dcp.load(state, checkpoint_id=a.dcp_load)
        dist.barrier()
        if rank == 0:
            print(f"dcp_{'save' if a.dcp_save else 'load'}_s {time.perf_counter() - t:.4f}")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if rank == 0:
        print(f"peak_rss_mib {peak_kib / 1024:.1f} net_of_interpreter_mib {(peak_kib - rss_before_kib) / 1024:.1f}")
    # Every rank is done once the barrier returns. Leave without tearing down the Gloo group: its teardown
    # after ZeroRedundancyOptimizer once ended in std::terminate (SIGABRT; one run of five here, PyTorch 2.13),
    # which would stop the benchmark after the figures were written.
    dist.barrier()
    sys.stdout.flush()
    if out:
        out.close()
    os._exit(0)


if __name__ == "__main__":
    main()
