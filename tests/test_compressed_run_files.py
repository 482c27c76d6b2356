"""Committed runs keep metrics.jsonl, log.txt and sparsity_masks.jsonl compressed
(`rundir.compressed`): every reader takes the plain file, its `.xz` or its `.gz`, prefers the plain
one, and reads a damaged archive as empty."""

import gzip
import lzma

import pytest

from rundir import compressed
from rundir.layout import is_run_dir
from rundir.metrics import metrics_by_steps_done, read_metrics
from rundir.status import read_status

LINES = b'{"step": 2, "format": 2, "loss": 1.5}\n{"step": 4, "format": 2, "loss": 1.25}\n'


@pytest.mark.parametrize("suffix, pack", [(".xz", lzma.compress), (".gz", gzip.compress)])
def test_metrics_read_the_same_from_a_compressed_file(tmp_path, suffix, pack):
    (tmp_path / f"metrics.jsonl{suffix}").write_bytes(pack(LINES))
    assert is_run_dir(tmp_path)
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.5, 1.25]
    assert [r["step"] for r in metrics_by_steps_done(tmp_path / "metrics.jsonl")] == [2, 4]


def test_the_plain_file_wins_and_a_damaged_archive_reads_as_empty(tmp_path):
    path = tmp_path / "metrics.jsonl"
    (tmp_path / "metrics.jsonl.xz").write_bytes(b"not xz at all")
    assert compressed.read_bytes(path) == b"" and read_metrics(path) == []
    path.write_bytes(
        LINES[: LINES.index(b"\n") + 1]
    )  # a run being written: plain, and read in preference
    assert compressed.stored(path) == path and [r["step"] for r in read_metrics(path)] == [2]
    with pytest.raises(FileNotFoundError, match="nor metrics.jsonl.xz, metrics.jsonl.gz"):
        compressed.read_bytes(tmp_path / "absent" / "metrics.jsonl")


def test_an_old_run_status_is_read_from_its_compressed_log(tmp_path):
    log = (
        "2026-01-01 10:00:00,000 INFO train: resumed at step 40\n2026-01-01 10:05:00,000 ERROR "
        "train: out of memory\n"
    )
    compressed.write_xz(log.encode(), tmp_path / "log.txt")
    status = read_status(tmp_path)  # no status.json: a run from before it existed
    assert status.resumed_at == [40] and status.reason == "out of memory"
