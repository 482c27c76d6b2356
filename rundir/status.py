"""status.json: what a run is doing or how it ended (running | finished | preempted | failed, at
which step, why, the steps it was resumed at, and the run's identity), and the one definition of a
finished training run.

Older run directories have no status.json: their state is inferred from log.txt (`read_status`).
"""

import errno
import json
import os
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import compressed
from .atomic import atomic_write_text
from .digests import verify
from .errors import CommandError
from .json_files import read_json
from .layout import LOG, STATUS, TEACHER, checkpoint_dir, list_checkpoints
from .typed_records import STATUS_FIELDS, UnreadableRecord, checked

RUNNING, FINISHED, PREEMPTED, FAILED = "running", "finished", "preempted", "failed"


@dataclass
class RunStatus:
    """How a run stands. `state`: running | finished | preempted | failed, or "" when unknown (an
    old run directory whose log says nothing). A `running` run whose process was killed (SIGKILL,
    out of memory, a lost node) stays `running`: nothing is left to record it. `recorded`: read from
    status.json (False: inferred from an old log)."""

    state: str = ""
    step: int | None = None  # steps done when the state was recorded
    reason: str = (
        ""  # a failure's exception, e.g. "TrainingDiverged: non-finite loss at step 41 (...)"
    )
    resumed_at: list[int] = field(default_factory=list)  # steps the run was resumed at, in order
    time: str = ""
    recorded: bool = True
    run_id: str = (
        ""  # made at the run's fresh start; every checkpoint it writes carries it (`new_run_id`)
    )


def new_run_id() -> str:
    """A run's identity, made when it starts at step 0: 16 hex digits."""
    return secrets.token_hex(8)


def write_status(
    run_dir: Path,
    state: str,
    step: int,
    reason: str = "",
    resumed_at: list[int] | None = None,
    run_id: str = "",
) -> RunStatus:
    """Record the run's state (rank 0: at start, finish, preemption and failure)."""
    if state not in (RUNNING, FINISHED, PREEMPTED, FAILED):
        raise ValueError(f"unknown run state {state!r}")
    status = RunStatus(
        state,
        step,
        reason,
        list(resumed_at or []),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        run_id=run_id,
    )
    record = {k: v for k, v in asdict(status).items() if k != "recorded"}
    text = json.dumps(record, indent=1) + "\n"
    try:
        atomic_write_text(Path(run_dir) / STATUS, text)
    except OSError as e:
        if e.errno not in DISK_FULL or not _overwrite_in_place(Path(run_dir) / STATUS, text):
            raise
    return status


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _overwrite_in_place(path: Path, text: str) -> bool:
    """The disk is full (no room for a temporary file): rewrite the existing small file in place, in
    its blocks, so that the run's state still says `failed` and why. Not atomic; used only where the
    atomic write cannot be."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        data = text.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def resumed_history(previous: RunStatus, start_step: int, resumed: bool) -> list[int]:
    """The `resumed_at` of a run (re)starting at `start_step`: the earlier resumptions it keeps
    (those before the step it continues from; the metrics after it are rewritten too), then this
    one."""
    return [s for s in previous.resumed_at if s < start_step] + ([start_step] if resumed else [])


def read_status(run_dir: Path) -> RunStatus:
    """The run's status.json, or for older run directories what their log.txt says."""
    record = read_json(Path(run_dir) / STATUS)
    if record is None:
        return _status_from_old_log(Path(run_dir) / LOG)
    try:
        record = checked(record, STATUS_FIELDS, STATUS)
    except (
        UnreadableRecord
    ) as e:  # its state is unknown, and says why; the trainer writes a new one
        return RunStatus(state="", reason=str(e))
    return RunStatus(
        state=record.get("state") or "",
        step=record.get("step"),
        reason=record.get("reason") or "",
        resumed_at=list(record.get("resumed_at") or []),
        time=record.get("time") or "",
        run_id=record.get("run_id") or "",
    )


_LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$"
)
_RESUMED = re.compile(r"^resumed at step (\d+)")
_OLD_PREEMPTED = re.compile(r"^SIGTERM: checkpoint saved at step (\d+)")


def _status_from_old_log(path: Path) -> RunStatus:
    """Runs written before status.json: the last log event tells a failure (ERROR / CRITICAL) or a
    preemption (the trainer's "SIGTERM: checkpoint saved at step N"); "resumed at step N" lines give
    the resumptions."""
    status = RunStatus(recorded=False)
    if not compressed.exists(path):
        return status
    text = compressed.read_bytes(path).decode("utf-8", "replace")
    events = [m for line in text.splitlines() if (m := _LOG_LINE.match(line))]
    status.resumed_at = [
        int(r.group(1)) for m in events if (r := _RESUMED.match(m.group("message")))
    ]
    if events:
        level, message = events[-1].group("level"), events[-1].group("message")
        if level in ("ERROR", "CRITICAL"):
            status.state, status.reason = FAILED, message
        elif preempted := _OLD_PREEMPTED.match(message):
            status.state, status.step = PREEMPTED, int(preempted.group(1))
    return status


# --------------------------------------------------------- finished (train.py's and the launcher's)
def last_step(cfg) -> int:
    """The step a run stops at: `cfg.total_steps`, or `train.max_steps` where that cuts the schedule
    short."""
    total = cfg.total_steps
    return min(total, cfg.train.max_steps) if cfg.train.max_steps > 0 else total


def nothing_left_at(run_dir: Path, step: int, last: int, total: int) -> bool:
    """Whether a run whose checkpoint is at `step` has nothing left to do: it is at its last step
    (`last_step`) and, for a full run (`last` = `total`), its final teacher is exported. Such a run
    is not restarted or rewritten."""
    return step >= last and (last < total or (Path(run_dir) / TEACHER).exists())


def resumable_step(run_dir: Path, last: int) -> int:
    """The step train.py would resume from, as far as "finished" depends on it: a checkpoint at the
    last step counts only if it has a digest and matches it (train.py sets a damaged one aside and
    refuses one without a digest; a junk file named like it is not a finished run); earlier ones are
    taken by name (train.py checks them when it resumes), so a status does not hash every
    checkpoint."""
    for step, path in reversed(list_checkpoints(checkpoint_dir(run_dir))):
        if step < last:
            return step
        try:
            if verify(path):
                return step
        except (CommandError, OSError):
            continue
    return 0
