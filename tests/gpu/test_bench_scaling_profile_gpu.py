"""`scripts/bench_scaling.py --profile` on one CUDA GPU: a timed row carries its kernel breakdown,
and with one process no collective runs, so the whole step is computation. Run with `pytest -m
gpu`."""

import pytest
import torch
from tiny_run import TINY_MODEL_AND_DATA

from configs import load_config
from scripts import bench_scaling
from training.distributed import DistContext

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine"
)
@pytest.mark.parametrize("fraction", [0, 1])
def test_profiled_row_on_one_gpu(tmp_path, fraction):
    ctx = DistContext(0, 1, 0, torch.device("cuda"))
    cfg = load_config(
        bench_scaling.REPO / "configs" / "default.yaml",
        [
            *bench_scaling.BENCH_OVERRIDES,
            *TINY_MODEL_AND_DATA,
            f"sparsity.sparse_fraction={fraction}",
            "sparsity.backend=cusparselt",
            "train.compile=false",
        ],
    )  # auto may keep tiny GEMMs dense
    row = bench_scaling.time_model(ctx, cfg, warmup=2, iters=2, workdir=tmp_path, profile=2)
    profile = row["profile"]
    assert profile["steps"] == 2 and profile["busy_ms"] > 0
    comm = profile["communication"]
    assert comm["communication_ms"] == comm["exposed_ms"] == 0.0
    assert comm["compute_busy_ms"] == pytest.approx(profile["busy_ms"], abs=1e-3)
    assert ("sparse_gemm" in profile["by_category_ms"]) == bool(fraction)
