"""The committed results stay within a budget: 30 MB in all, no figure over 250 KB, and the runs'
logs compressed (`rundir.compressed`: metrics.jsonl, log.txt and sparsity_masks.jsonl as .xz, which
every reader takes).

An 80-epoch ViT-Ti/4 run commits about 160 KB (its logs compressed, its probes' records), a table
about 400 KB with its figures. The first budget, 25 MB, held the 107 runs of 2026-11-29 (23.3 MB);
30 MB holds the CIFAR-10 study's planned remainder (about 20 runs and their tables, ~4 MB) on top of
the 25.1 MB of 2026-12-01, and no more: a study beyond it has to make room (older runs' probes or
figures) rather than raise the figure again."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 30_000_000
FIGURE_BYTES = 250_000
PLAIN_LOGS = (
    "metrics.jsonl",
    "log.txt",
    "sparsity_masks.jsonl",
    "sparsity_masks.jsonl.gz",
    "metrics.jsonl.gz",
    "log.txt.gz",
)


def _results_files() -> list[Path]:
    """The files of results/ as committed (git's list where this is a checkout, else what is on
    disk)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "results"], cwd=REPO, capture_output=True, check=True
        )
        names = [n for n in listed.stdout.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
    if not names:
        names = [str(p.relative_to(REPO)) for p in (REPO / "results").rglob("*") if p.is_file()]
    return [REPO / n for n in names if (REPO / n).is_file()]


@pytest.fixture(scope="module")
def files():
    found = _results_files()
    assert found, "no results/ files found"
    return found


def test_results_fit_the_budget(files):
    total = sum(p.stat().st_size for p in files)
    biggest = sorted(files, key=lambda p: p.stat().st_size)[-5:]
    assert total <= BUDGET_BYTES, (
        f"results/ holds {total / 1e6:.2f} MB, over {BUDGET_BYTES / 1e6:.0f} MB; largest: "
        + ", ".join(f"{p.relative_to(REPO)} {p.stat().st_size // 1000} KB" for p in biggest)
    )


def test_no_figure_is_over_250_kb(files):
    over = [
        f"{p.relative_to(REPO)} ({p.stat().st_size // 1000} KB)"
        for p in files
        if p.suffix == ".png" and p.stat().st_size > FIGURE_BYTES
    ]
    assert over == [], over


def test_run_logs_are_committed_compressed(files):
    plain = [
        str(p.relative_to(REPO))
        for p in files
        if p.name in PLAIN_LOGS and (p.parent / "config.yaml").is_file()
    ]
    assert plain == [], (
        f"commit these as .xz (scripts/experiments/study_import.py does): {plain[:5]}"
    )
