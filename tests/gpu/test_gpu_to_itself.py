"""The record behind a table's speed columns (reporting/speed_columns.py): the memory in use on the
run's GPU outside its own allocator. The run's own tensors must not count, another process's
must."""

import subprocess
import sys

import pytest
import torch

from reporting.speed_columns import SHARED_GPU_MB
from training.run_records import metrics_line

pytestmark = pytest.mark.gpu

HOLD_6_GB = """
import sys, torch
x = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
sys.stdin.readline()
"""


def _outside_mb() -> float:
    line = metrics_line(
        10, "sparse", 1.0, corrupt_skipped=0, images_per_s=1.0, device=torch.device("cuda")
    )
    return line["gpu_mem_outside_mb"]


def test_own_tensors_do_not_count_and_another_process_does():
    torch.cuda.init()
    alone = _outside_mb()
    assert 0.0 <= alone < SHARED_GPU_MB  # the context and libraries of this process alone
    own = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")  # 2 GB of our own
    assert abs(_outside_mb() - alone) < 256.0
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD_6_GB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline().strip() == "holding"
        assert _outside_mb() > SHARED_GPU_MB  # 6 GB of another process (and its context)
    finally:
        other.communicate("\n", timeout=60)
    del own
