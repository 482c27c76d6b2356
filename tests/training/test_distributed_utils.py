"""Collective helpers of the trainer on 2 gloo processes: gathering per-rank objects, catching
replicas that drifted apart."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.distributed import DistContext, all_gather_objects, check_replicas_identical

CPU = DistContext(0, 1, 0, torch.device("cpu"))


def _worker(rank, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    ctx = DistContext(rank, 2, rank, torch.device("cpu"))
    try:
        out = {"gathered": all_gather_objects({"rank": rank, "t": torch.full((2,), rank)}, ctx)}
        same = [torch.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.bfloat16)]
        check_replicas_identical(same, ctx, "same tensors")  # no error
        drifted = [same[0], same[1] + rank * 2**-6]
        try:
            check_replicas_identical(drifted, ctx, "drifted tensors")
            out["error"] = None
        except RuntimeError as e:
            out["error"] = str(e)
        results[rank] = out
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results():
    with tempfile.TemporaryDirectory() as d, mp.Manager() as manager:
        shared = manager.dict()
        mp.spawn(_worker, args=(os.path.join(d, "init"), shared), nprocs=2)
        return dict(shared)


def test_all_gather_objects_gives_every_rank_the_list_in_rank_order(results):
    for rank in (0, 1):
        gathered = results[rank]["gathered"]
        assert [g["rank"] for g in gathered] == [0, 1]
        assert torch.equal(gathered[1]["t"], torch.full((2,), 1))


def test_drifted_replicas_raise_on_every_rank(results):
    for rank in (0, 1):
        assert "drifted tensors differ between ranks" in results[rank]["error"]


def test_single_process_helpers_are_trivial():
    assert all_gather_objects("x", CPU) == ["x"]
    check_replicas_identical([torch.ones(1)], CPU, "anything")
