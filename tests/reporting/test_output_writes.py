"""Every file the reports write is written as training writes its files: into a temporary file
renamed into place, so a link planted at an output's name is replaced (its target untouched) and a
kill mid-write leaves the old file, never a truncated one."""

import json
from pathlib import Path

import pytest

from reporting.table import make_table
from rundir import atomic as atomic_io

RUNS = Path(__file__).resolve().parents[2] / "results" / "cifar10" / "recipe" / "screen"
OUTPUTS = (
    "table.md",
    "table.csv",
    "summary.json",
    "top1_vs_sparsity.png",
    "loss_curves.png",
    "masks.png",
)


def test_outputs_replace_planted_links_instead_of_writing_through_them(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    for name in OUTPUTS:
        (outside / name).write_text("not yours")
        (out / name).symlink_to(outside / name)
    written = make_table([RUNS / "dense_s2", RUNS / "sparse100_ste_s0"], out)
    assert {p.name for p in written} >= set(OUTPUTS)
    for name in OUTPUTS:
        assert (outside / name).read_text() == "not yours", name  # the link's target is untouched
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name
    assert json.loads((out / "summary.json").read_text())["rows"]


def test_a_kill_while_the_summary_is_written_leaves_the_previous_one(tmp_path, monkeypatch):
    out = tmp_path / "out"
    make_table([RUNS / "dense_s2"], out, plots=False)
    before = (out / "summary.json").read_text()
    real = atomic_io.os.replace

    def killed(src, dst):  # the process dies between writing the temporary file and renaming it
        if str(dst).endswith("summary.json"):
            raise KeyboardInterrupt("killed before the rename")
        return real(src, dst)

    monkeypatch.setattr(atomic_io.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        make_table([RUNS / "dense_s2", RUNS / "sparse100_ste_s0"], out, plots=False)
    assert (out / "summary.json").read_text() == before
