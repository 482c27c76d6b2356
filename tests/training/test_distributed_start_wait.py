"""A data-parallel start whose peers never come (torchrun variables left in a shell) says what it
waits for and where, waits at most train.dist_start_timeout_s, then stops with one line and exit
status 1: torch's own default is 30 minutes of silence while the run directory stays locked."""

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_start_whose_peer_never_comes_is_bounded_and_said(tmp_path):
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29400 + os.getpid() % 500),
    }
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--output-dir",
            str(tmp_path / "run"),
            "train.max_steps=1",
            "train.dist_start_timeout_s=3",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 1 and time.monotonic() - start < 120
    assert (
        "rank 0: waiting up to 3 s for the 2 processes of this torchrun launch to join at "
        "127.0.0.1:" in result.stderr
    )
    assert (
        "did not all join" in result.stderr
        and "unset RANK, WORLD_SIZE, LOCAL_RANK" in result.stderr
    )
    assert "Traceback" not in result.stderr
