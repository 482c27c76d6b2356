"""The layers `scripts/bench_sparse.py` times and profiles: a ViT-L MLP linear (nn.Linear, or
SemiSparseLinear on a backend) with a fixed seed, the fc1 -> GELU -> fc2 MLP, and one eager forward
+ backward of either under autocast."""

import torch
from torch import nn


def linear_pair(in_f, out_f, backend):
    from sparsity import SemiSparseLinear

    torch.manual_seed(0)
    lin = nn.Linear(in_f, out_f, device="cuda")
    if backend is None:
        return lin
    return SemiSparseLinear.from_dense(lin, backend=backend)


def mlp(backend):
    fc1 = linear_pair(1024, 4096, backend)
    fc2 = linear_pair(4096, 1024, backend)
    return nn.Sequential(fc1, nn.GELU(), fc2)


def fwd_bwd_step(model, x, dy, dtype):
    """One eager forward + backward of `model` under autocast, gradients cleared first."""
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        with torch.autocast("cuda", dtype=dtype):
            y = model(x)
        y.backward(dy)

    return step
