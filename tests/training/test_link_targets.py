"""Writes never leave the run through a link: an appended file with other hard links (log.txt linked
from outside) is refused naming it, and an output= or index= that is a symlink is refused before the
probe (the atomic rename would replace the link, or the write would land where it points)."""

import os
import sys
from pathlib import Path

import pytest

from rundir.errors import RunDirProblem
from rundir.metrics import open_append

REPO = Path(__file__).resolve().parents[2]


def test_an_appended_file_with_another_hard_link_is_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs\n")
    os.link(outside, tmp_path / "log.txt")
    with pytest.raises(RunDirProblem, match="has other hard links"):
        open_append(tmp_path / "log.txt")
    assert outside.read_text() == "theirs\n"
    with open_append(tmp_path / "own.txt") as f:  # a file of its own: appended
        f.write("line\n")
    assert (tmp_path / "own.txt").read_text() == "line\n"


@pytest.mark.parametrize("key", ["output", "index"])
def test_a_symlink_as_a_result_target_is_refused_before_the_probe(tmp_path, key):
    sys.path.insert(0, str(REPO / "tests" / "evaluation"))
    sys.path.insert(0, str(REPO))
    from eval_test_helpers import FAST_EVAL, make_run_dir

    import eval_linear

    run = make_run_dir(tmp_path / "runs" / "tiny")
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"{key}={link}"]) == 1
    assert (
        link.is_symlink() and target.read_text() == "{}" and not (run / "eval_linear.json").exists()
    )
