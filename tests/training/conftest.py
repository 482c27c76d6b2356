"""A shared uninterrupted tiny run that interrupted ones are compared with."""

from pathlib import Path

import pytest
from train_runs import run_train


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """One uninterrupted tiny run that the interrupted ones are compared with."""
    out = tmp_path_factory.mktemp("reference")
    run_train(out)
    return out
