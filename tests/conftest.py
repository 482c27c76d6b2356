"""Test-session set-up: CPU runs use Triton's interpreter, GPU-only tests skip with a reason."""

import os

# Idle OpenMP threads sleep instead of spinning: on a machine whose cores are shared (two CI cores,
# a second torch process), spinning threads of one process starve the others and every small op
# waits for a descheduled thread. Read once, when torch loads libgomp, so before the import;
# subprocesses (train.py, eval_linear.py) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Must be set before any @triton.jit decorator runs, i.e. before sparsity's kernel modules are
    # imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from configs.torch_env import ensure_torchvision_importable  # noqa: E402

ensure_torchvision_importable()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """One process, one test at a time, where the GPU is in play: GPU tests time kernels and fill
    its memory, so workers sharing one GPU would disturb each other (pyproject.toml spreads CPU runs
    over workers)."""
    if hasattr(config.option, "numprocesses") and (
        torch.cuda.is_available() or "gpu" in (config.option.markexpr or "").replace("not gpu", "")
    ):
        config.option.numprocesses = 0


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches and flags reset around a test, so that graphs compiled for one test
    never serve another and a test that forbids recompilation does not leak that into the next
    one."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.error_on_recompile = False
