"""metrics.jsonl: one JSON object per logged step (rank 0), appended; read back by the tables, the
launcher's status and a resumed run (which first drops the lines its checkpoint does not cover).

Steps are counted as steps done: since format 2 a line's `step` is the number of optimizer steps
done when it was logged; lines written before carry no `format` key and counted from 0 (`steps_done`
reads both). A line cut by a kill mid-write is skipped by the readers and dropped on resume; every
other rewrite is atomic.
"""

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

from . import compressed
from .atomic import atomic_write_text
from .errors import RunDirProblem
from .json_files import parse_json
from .layout import METRICS
from .typed_records import METRICS_LINE_FIELDS, checked

FORMAT_KEY = "format"  # metrics.jsonl: absent (format 1) = `step` counted from 0; 2 = steps done
METRICS_FORMAT = 2
# Fields that measure the machine rather than the computation; they differ between otherwise
# identical runs.
TIMING_FIELDS = (
    "images_per_s",
    "step_time_s",
    "data_time_s",
    "time",
    "max_mem_mb",
    "gpu_mem_outside_mb",
)


def steps_done(record: dict) -> int:
    """Optimizer steps done when `record` (a metrics.jsonl line) was logged, whatever its format."""
    step = int(record["step"])
    return step if (record.get(FORMAT_KEY) or 1) >= 2 else step + 1


def _parsed(line: str) -> dict | None:
    """A metrics line's record, None for a line cut by a kill mid-write (or anything else that is
    not one)."""
    try:
        record = checked(parse_json(line), METRICS_LINE_FIELDS, METRICS)
    # UnreadableRecord too: a line whose fields have the wrong types is as good as a torn one
    except ValueError:
        return None
    return record if isinstance(record.get("step"), int) else None


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl as written (`step` in the file's own format), unparsable lines
    skipped; the file may be stored compressed (`rundir.compressed`). FileNotFoundError if there is
    no such file."""
    # bytes that are not UTF-8 (a damaged or foreign file) spoil their line only, which is then
    # skipped
    lines = compressed.read_bytes(path).decode("utf-8", "replace").splitlines()
    return [r for line in lines if line.strip() and (r := _parsed(line)) is not None]


def metrics_by_steps_done(path: Path) -> list[dict]:
    """The records with `step` read as steps done (older lines converted by `steps_done`). A step
    going backwards means the run restarted there (train.py truncates the file when it resumes, but
    files written by older versions may repeat steps): the later lines replace the earlier ones from
    that step on."""
    records: list[dict] = []
    for record in read_metrics(path) if compressed.exists(path) else []:
        record = {**record, "step": steps_done(record)}
        while records and records[-1]["step"] >= record["step"]:
            records.pop()
        records.append(record)
    return records


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):  # e.g. sparsity_masks.jsonl's value per layer
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "item"):  # a tensor or numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as strings
    return value


class MetricsLog:
    """Appends metrics.jsonl lines (`enabled`: the one rank that writes). On resume, lines for steps
    the checkpoint does not cover are dropped first (`truncate_after`): the resumed run logs them
    again, so an interrupted-then- resumed run leaves the same file as an uninterrupted one."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def truncate_after(self, step: int) -> int | None:
        """Keep only lines logged with at most `step` steps done (those a run resumed at `step` will
        not log again); 0 empties the file. Everything after a cut line goes too. Returns the steps
        done of the last line kept (None: none)."""
        if not self.enabled or not (self.path.exists() or self.path.is_symlink()):
            return None
        # never read or write another file through a link planted in the run
        if self.path.is_symlink():
            raise RunDirProblem(
                f"{self.path} is a symlink: a run's metrics are a file of its own; remove the link"
            )
        kept, last = [], None
        for line in self.path.read_text().splitlines():
            record = _parsed(line)
            if record is None or steps_done(record) > step:
                break
            kept.append(line)
            last = steps_done(record)
        atomic_write_text(
            self.path, "".join(f"{line}\n" for line in kept)
        )  # a kill here keeps the old file
        return last

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({k: _plain(v) for k, v in record.items()})
        with open_append(self.path) as f:
            f.write(line + "\n")
            f.flush()


def open_append(path: Path):
    """`path` opened to append text, created if absent; never through a symlink nor into a file with
    other hard links (`RunDirProblem`, naming it), so the run's appended files (metrics.jsonl,
    log.txt) cannot be redirected outside it."""
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise RunDirProblem(
            f"{path} is a symlink: the run appends to a file of its own, never through a link; "
            "remove the link"
        ) from None
    if os.fstat(fd).st_nlink > 1:  # the same file under another name, maybe outside the run
        os.close(fd)
        raise RunDirProblem(
            f"{path} has other hard links: the run appends to a file of its own, never to one "
            "shared with another name; remove the links or the file"
        )
    # UTF-8 whatever the locale (LC_ALL=C would make a non-ASCII path a logging error and lose the
    # line); a path's bytes that the locale could not decode are written back as they were
    # (surrogateescape)
    return os.fdopen(fd, "a", encoding="utf-8", errors="surrogateescape")
