"""The Slurm controller the launcher tests need: skipped with a reason where none answers, a failure
under REQUIRE_SLURM=1. `.ci/run` runs the README's `pytest` line first (CI=true, no Slurm yet: these
skip, so that line passes on its own on any machine), then starts one with .ci/slurm_setup.sh and
runs `pytest tests/slurm -m slurm` with REQUIRE_SLURM=1. Tests that use the `slurm_cluster` fixture
are marked `slurm`."""

import os

import pytest
from launcher_helpers import controller_problem


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: needs a real Slurm controller (the `slurm_cluster` fixture)"
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    problem = controller_problem()
    if problem:
        message = (
            f"{problem}; start one with `sudo .ci/slurm_setup.sh` (Debian/Ubuntu, single node on "
            f"localhost)"
        )
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(f"REQUIRE_SLURM=1 needs a real Slurm: {message}")
        pytest.skip(message)
