"""A shared uninterrupted tiny run that interrupted ones are compared with."""

from pathlib import Path

import pytest
from train_runs import run_train


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """One uninterrupted tiny run that the interrupted ones are compared with; it keeps every
    checkpoint (the tests resume from its earlier ones), where the other tiny runs keep their last
    three."""
    out = tmp_path_factory.mktemp("reference")
    result = run_train(out, "train.max_to_keep=10")
    (out.parent / f"{out.name}.stderr").write_text(
        result.stderr
    )  # what a Slurm .err file would hold
    return out


@pytest.fixture(scope="session")
def reference_stderr(reference_run) -> str:
    """The reference run's stderr (a pipe, not a terminal)."""
    return (reference_run.parent / f"{reference_run.name}.stderr").read_text()
