"""The SSL loader: batch layout from a config, bit-identical batches across num_workers and
resume."""

import faulthandler
import gc
import itertools
import logging
import multiprocessing.util
import os
import signal

import torch

from data import build_ssl_loader
from data.loader import build_training_dataset


def batches(loader, n):
    return list(itertools.islice(iter(loader), n))


def assert_same(a, b):
    a, b = a.fields(), b.fields()
    assert a.keys() == b.keys()
    for k in a:
        if torch.is_tensor(a[k]):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_batch_layout_from_config(small_cfg):
    cfg = small_cfg()
    (batch,) = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 1)
    B, nL = 4, 2
    assert batch.global_crops.shape == (2 * B, 3, 16, 16)
    assert batch.local_crops.shape == (nL * B, 3, 8, 8)
    assert batch.masks.shape == (2 * B, (16 // 4) ** 2)
    assert int(batch.masks.any(1).sum()) == B  # int(2B * 0.5) masked global crops
    assert batch.labels.shape == (B,) and int(batch.corrupt_skipped) == 0
    cfg0 = small_cfg("crops.local_crops_number=0")
    (batch,) = batches(build_ssl_loader(cfg0, rank=0, world_size=1, start_step=0), 1)
    assert batch.local_crops.shape == (0, 3, 8, 8)


def test_same_batches_with_0_and_2_workers(small_cfg):
    cfg = small_cfg()
    ref = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0, num_workers=0), 4)
    par = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0, num_workers=2), 4)
    for a, b in zip(ref, par):
        assert_same(a, b)
    assert not torch.equal(ref[0].global_crops, ref[1].global_crops)
    # crop 0 and crop 1 of one image differ (independent augmentations)
    assert not torch.equal(ref[0].global_crops[0], ref[0].global_crops[4])


def test_spawned_workers_give_the_same_batches(small_cfg):
    # fresh worker processes (for tools that build a loader after starting threads) must receive
    # everything they need by pickling (dataset, collate, seeds) and draw the same stream as forked
    # or no workers
    cfg = small_cfg()
    ref = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=1, num_workers=0), 2)
    loader = build_ssl_loader(
        cfg, rank=0, world_size=1, start_step=1, num_workers=1, multiprocessing_context="spawn"
    )
    assert loader.dataloader.multiprocessing_context.get_start_method() == "spawn"
    for a, b in zip(ref, batches(loader, 2)):
        assert_same(a, b)


def _abort_quietly():
    # no "Fatal Python error" dump in the test's output: the signal is what matters
    faulthandler.disable()
    os.kill(os.getpid(), signal.SIGABRT)


class AbortsWhenItsWorkerExits(torch.utils.data.Dataset):
    """A dataset whose worker processes die by SIGABRT as they exit, after every batch was
    delivered: what a worker with a C++ thread left over does ("terminate called without an active
    exception")."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if torch.utils.data.get_worker_info() is not None and not getattr(self, "armed", False):
            self.armed = True
            multiprocessing.util.Finalize(
                None, _abort_quietly, exitpriority=100
            )  # runs as the worker exits
        return self.dataset[index]


def test_a_worker_dying_as_it_stops_does_not_fail_the_close(small_cfg, caplog):
    # Stopping the workers after the last batch was delivered loses nothing, so a worker that dies
    # while exiting is a warning naming its signal, not an error: PyTorch's SIGCHLD handler would
    # otherwise raise in the middle of the close (a benchmark lost all its results to this once).
    cfg = small_cfg()
    ref = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0, num_workers=0), 3)
    dataset = AbortsWhenItsWorkerExits(build_training_dataset(cfg))
    loader = build_ssl_loader(
        cfg, rank=0, world_size=1, start_step=0, num_workers=2, dataset=dataset
    )
    stream = iter(loader)
    first = [next(stream), next(stream)]
    with caplog.at_level(logging.WARNING, logger="data.loader"):
        loader.close()
    assert (
        caplog.text.count("died by SIGABRT as it stopped; every batch asked for was delivered") == 2
    )
    # closed, it starts new workers where it stopped
    for a, b in zip(ref, first + batches(loader, 1)):
        assert_same(a, b)
    loader.close()


def test_resume_at_step_k_continues_the_stream(small_cfg):
    cfg = small_cfg()
    ref = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 5)
    for k in (1, 3):
        resumed = batches(
            build_ssl_loader(
                cfg, rank=0, world_size=1, start_step=k, num_workers=2 if k == 3 else 0
            ),
            5 - k,
        )
        for a, b in zip(ref[k:], resumed):
            assert_same(a, b)


def test_loader_state_and_reiteration(small_cfg):
    cfg = small_cfg()
    ref = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 4)
    loader = build_ssl_loader(cfg, rank=0, world_size=1, start_step=0, num_workers=2)
    got = batches(loader, 2)
    state = loader.state_dict()
    assert state["next_step"] == 2 and state["position"] == 2 * 4 and state["batch_size"] == 4
    got += batches(loader, 2)  # a new iterator restarts at next_step despite the workers' prefetch
    for a, b in zip(ref, got):
        assert_same(a, b)


def test_loader_continues_its_state_dict_on_any_world_size(small_cfg):
    """A checkpoint stores `loader.state_dict()` (the sampler's state at the delivered batches) and
    a new loader continues from it: the same world size, or another one that divides the samples
    consumed."""
    cfg = small_cfg()
    ref = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 5)
    loader = build_ssl_loader(cfg, rank=0, world_size=1, num_workers=2)
    batches(loader, 2)
    state = loader.state_dict()
    assert (
        state["samples_consumed"] == 8
        and state["world_size"] == 1
        and state["seed"] == cfg.train.seed
    )
    resumed = build_ssl_loader(cfg, rank=0, world_size=1, sampler_state=state)
    assert resumed.next_step == 2 and resumed.state_dict() == state
    for a, b in zip(ref[2:], batches(resumed, 3)):
        assert_same(a, b)
    # two ranks deliver 3 batches each (24 samples of the global stream); one rank continues at
    # sample 24
    two = [build_ssl_loader(cfg, rank=r, world_size=2) for r in range(2)]
    for loader in two:
        batches(loader, 3)
    state = two[0].state_dict()
    assert state["samples_consumed"] == 24 == two[1].state_dict()["samples_consumed"]
    one = build_ssl_loader(cfg, rank=0, world_size=1, sampler_state=state)
    assert one.next_step == 6
    for a, b in zip(
        batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=6), 2), batches(one, 2)
    ):
        assert_same(a, b)


def test_ranks_differ_and_seed_matters(small_cfg):
    cfg = small_cfg()
    r0 = batches(build_ssl_loader(cfg, rank=0, world_size=2, start_step=0), 1)[0]
    r1 = batches(build_ssl_loader(cfg, rank=1, world_size=2, start_step=0), 1)[0]
    other = batches(
        build_ssl_loader(small_cfg("train.seed=8"), rank=0, world_size=2, start_step=0), 1
    )[0]
    assert not torch.equal(r0.global_crops, r1.global_crops)
    assert not torch.equal(r0.global_crops, other.global_crops)


def test_global_rng_untouched(small_cfg):
    """The loader neither reads nor advances torch's global RNG (the trainer's randomness stays its
    own)."""
    cfg = small_cfg()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 2)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)  # a different global state does not change the batches
    a = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 1)[0]
    torch.manual_seed(5)
    b = batches(build_ssl_loader(cfg, rank=0, world_size=1, start_step=0), 1)[0]
    assert_same(a, b)


def test_cuda_generators_never_reseeded(small_cfg, monkeypatch):
    """With num_workers=0 the augmentation runs in the trainer's process: it must not reseed CUDA's
    RNG."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the data pipeline reseeded the CUDA generators")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", forbidden)
    monkeypatch.setattr(torch.cuda, "manual_seed", forbidden)
    batches(build_ssl_loader(small_cfg(), rank=0, world_size=1, start_step=0), 1)


class _GcStateDataset(torch.utils.data.Dataset):
    """The default dataset, refusing to deliver an image where automatic garbage collection is
    off."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if not gc.isenabled():
            raise RuntimeError("automatic garbage collection is off in this data worker")
        return self.inner[i]


def test_workers_collect_garbage_even_when_the_trainer_does_not(small_cfg):
    """The trainer turns automatic collection off for its loop (train.gc_period) and forks its
    workers inside it."""
    from data.datasets import build_dataset

    cfg = small_cfg()
    was = gc.isenabled()
    gc.disable()
    try:
        loader = build_ssl_loader(
            cfg,
            rank=0,
            world_size=1,
            start_step=0,
            num_workers=2,
            dataset=_GcStateDataset(build_dataset(cfg)),
        )
        assert len(batches(loader, 2)) == 2
        assert not gc.isenabled()  # the trainer's own setting is left alone
    finally:
        gc.enable() if was else gc.disable()
