"""Gradient averaging across ranks (2 gloo processes on CPU)."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from models.training.distributed import DistContext, all_reduce_mean_


def _worker(rank, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ctx = DistContext(rank, 2, rank, torch.device("cpu"))
    tensors = [torch.full((3,), float(rank + 1)), torch.arange(4.0).reshape(2, 2) * (rank + 1),
               torch.tensor([rank], dtype=torch.float64)]
    all_reduce_mean_(tensors, ctx)
    results[rank] = [t.clone() for t in tensors]
    dist.destroy_process_group()


def test_all_reduce_mean_averages_every_tensor_in_place():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(port, results), nprocs=2)
    for rank in (0, 1):
        a, b, c = results[rank]
        assert torch.equal(a, torch.full((3,), 1.5))
        assert torch.equal(b, torch.arange(4.0).reshape(2, 2) * 1.5)
        assert c.dtype == torch.float64 and c.item() == 0.5


def test_single_process_is_a_no_op():
    t = torch.ones(2)
    all_reduce_mean_([t], DistContext(0, 1, 0, torch.device("cpu")))
    assert torch.equal(t, torch.ones(2))
