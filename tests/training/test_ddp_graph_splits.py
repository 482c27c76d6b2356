"""`train.ddp_split_compiled_graphs` on 2 gloo processes: under DDP, dynamo cuts a compiled block
whose gradients span more than one gradient bucket into several graphs, and with the key off it
compiles one graph per block; either way DDP's gradients are those of one process's eager backward
over both ranks' batches together."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from configs import load_config
from models.vit_block import Block
from sparsity import swap_linear_modules
from training.compile import ddp_graph_splits

DIM, HEADS, TOKENS = (
    256,
    4,
    5,
)  # a block's fp32 gradients: 3.2 MB, more than DDP's 1 MB first bucket
BUCKET_MB = 1  # and more than each later bucket: the block spans several


def _model(sparse: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(Block(DIM, HEADS), Block(DIM, HEADS))
    if sparse:  # the sparse phase's blocks: 2:4 MLPs traced through sparsity.traced
        swap_linear_modules(model, pattern=r".*mlp\.fc[12]", backend="dense")
    return model


def _batch(rank: int) -> torch.Tensor:
    return torch.randn(4, TOKENS, DIM, generator=torch.Generator().manual_seed(100 + rank))


def _steps(split: bool, sparse: bool, rank: int) -> dict:
    """Two DDP steps of freshly compiled blocks: the number of graphs compiled and the gradients."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs = []

    # one call per graph dynamo hands on; runs it as traced
    def counting_backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    model = _model(sparse)
    for block in model:
        block.compile(backend=counting_backend, fullgraph=True, dynamic=False)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    for _ in range(2):  # the second step reuses the graphs
        for p in model.parameters():
            p.grad = None
        with ddp_graph_splits(split):
            loss = ddp(_batch(rank)).square().mean()
        loss.backward()
    return {
        "graphs": len(graphs),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
    }


def _worker(rank, init_file, sparse, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        results[rank] = {split: _steps(split, sparse, rank) for split in (True, False)}
    finally:
        dist.destroy_process_group()


def _run(sparse: bool) -> dict:
    with tempfile.TemporaryDirectory() as d, mp.Manager() as manager:
        shared = manager.dict()
        mp.spawn(_worker, args=(os.path.join(d, "init"), sparse, shared), nprocs=2)
        return dict(shared)


def _eager_gradients(sparse: bool) -> dict:
    """One process, no DDP, no compilation: the mean loss over both ranks' batches together."""
    model = _model(sparse)
    (model(torch.cat([_batch(0), _batch(1)])).square().mean()).backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_one_graph_per_block_without_splits_and_the_gradients_either_way(sparse):
    want = _eager_gradients(sparse)
    results = _run(sparse)
    for split, graphs in ((True, None), (False, 2)):
        for rank in (0, 1):
            got = results[rank][split]
            if graphs is None:
                assert got["graphs"] > 2, (
                    f"dynamo did not cut the blocks at the buckets: {got['graphs']} graphs"
                )
            else:
                assert got["graphs"] == graphs, got["graphs"]
            assert got["grads"].keys() == want.keys()
            for name, grad in want.items():
                torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_key_is_a_boolean_and_resumable():
    from configs.load import RESUMABLE_CHANGES

    assert (
        load_config(None, []).train.ddp_split_compiled_graphs is False
    )  # whole graphs: faster on two H200s
    assert (
        load_config(None, ["train.ddp_split_compiled_graphs=true"]).train.ddp_split_compiled_graphs
        is True
    )
    with pytest.raises(ValueError, match="train.ddp_split_compiled_graphs"):
        load_config(None, ["train.ddp_split_compiled_graphs=sometimes"])
    assert (
        "train.ddp_split_compiled_graphs" in RESUMABLE_CHANGES
    )  # how the step runs, not what it computes


@pytest.mark.parametrize("split", [True, False])
def test_the_trainer_runs_its_forward_under_the_key(tmp_path, split):
    """The key reaches the trainer's forward, where graphs are compiled (the backward's with
    them)."""
    import torch._dynamo
    from train_runs import TINY

    from scripts.benchmarks.batch import synthetic_batch
    from training.distributed import DistContext
    from training.trainer import Trainer

    cfg = load_config(None, TINY + [f"train.ddp_split_compiled_graphs={split}"])
    trainer = Trainer(cfg, tmp_path, DistContext(0, 1, 0, torch.device("cpu")))
    forward, seen = trainer.forward_model, []

    def spy(*args, **kwargs):
        seen.append(torch._dynamo.config.optimize_ddp)
        return forward(*args, **kwargs)

    trainer.forward_model = spy
    trainer.train_step(synthetic_batch(cfg, torch.device("cpu")), trainer.schedules.at(0))
    assert (
        seen == [split] and torch._dynamo.config.optimize_ddp is True
    )  # restored after the forward
