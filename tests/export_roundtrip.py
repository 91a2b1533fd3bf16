"""The export round trip through Python (issue 13), run by tests/checkpoint_process_test.cpp.

check CKPT_DIR EXPORT OUT: assembles every parameter of the checkpoint in CKPT_DIR from its shard files with
numpy alone (the manifest's regions, read here independently of dtrain's C++), compares them bit for bit with
the export `dtrain ckpt export` wrote (loaded with Python's safetensors and PyTorch), then writes OUT with
safetensors.torch.save_file: the same tensors halved (exact in floating point), for dtrain to import.

same A B: the tensors of two safetensors files are equal bit for bit (names, shapes, dtypes, values).
"""
import json
import sys

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file, save_file


def box_indices(region, shape):
    """The global row-major indices a block holds, in the block's order."""
    grids = np.meshgrid(*[np.arange(o, o + s) for o, s in zip(region["box_offset"], region["box_sizes"])],
                        indexing="ij")
    flat = np.ravel_multi_index([g.ravel() for g in grids], shape) if shape else np.zeros(1, dtype=np.int64)
    return flat[region["begin"]:region["begin"] + region["count"]]


def assemble(ckpt_dir):
    manifest = json.load(open(f"{ckpt_dir}/manifest.json"))
    files = [load_numpy(f"{ckpt_dir}/{f['name']}") for f in manifest["files"]]
    out = {}
    for key, t in manifest["tensors"].items():
        if not key.startswith("model/"):
            continue
        shape = t["shape"]
        numel = int(np.prod(shape)) if shape else 1
        whole = None
        seen = np.zeros(numel, dtype=bool)
        # a block is the shard file's tensor "<key>#<k>", the k-th block of that key in that file
        counters = {}
        for b in sorted(t["blocks"], key=lambda b: (b["file"], b["offset"])):
            k = counters.get(b["file"], 0)
            counters[b["file"]] = k + 1
            data = files[b["file"]][f"{key}#{k}"]
            if whole is None:
                whole = np.zeros(numel, dtype=data.dtype)
            idx = box_indices(b, shape)
            whole[idx] = data
            seen[idx] = True
        assert seen.all(), f"{key}: elements missing from the blocks"
        out[key[len("model/"):]] = whole.reshape(shape)
    return out


def main():
    if sys.argv[1] == "check":
        ckpt_dir, export, out = sys.argv[2:5]
        ours = assemble(ckpt_dir)
        theirs = load_file(export)
        assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
        for name, t in theirs.items():
            mine = torch.from_numpy(ours[name].copy())
            assert t.dtype == mine.dtype and t.shape == mine.shape, (name, t.dtype, mine.dtype, t.shape, mine.shape)
            assert torch.equal(t, mine), f"{name}: the export differs from the shard files"
        save_file({name: (t / 2).contiguous() for name, t in theirs.items()}, out, metadata={"format": "pt"})
        print(f"ok: {len(theirs)} tensors equal; halved copy written to {out}")
    elif sys.argv[1] == "same":
        a, b = load_file(sys.argv[2]), load_file(sys.argv[3])
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), f"{name} differs"
        print(f"ok: {len(a)} tensors equal")
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")


if __name__ == "__main__":
    main()
