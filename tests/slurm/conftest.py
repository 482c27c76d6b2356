"""The Slurm controller the launcher tests need: skipped with a reason where none answers, a failure under CI=true
(CI starts one with .ci/slurm_setup.sh)."""

import os

import pytest
from launcher_helpers import controller_problem


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    problem = controller_problem()
    if problem:
        message = f"{problem}; start one with `sudo .ci/slurm_setup.sh` (Debian/Ubuntu, single node on localhost)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs a real Slurm: {message}")
        pytest.skip(message)
