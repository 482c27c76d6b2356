"""The run directory's file format, in one place: its names, readers, writers and the run's status.

A run directory (`train.py --output-dir`) holds:

    config.yaml                     the resolved config (rewritten at each (re)start; resuming requires the same one)
    run_info.json                   the start-up summary of the latest (re)start (`progress.run_info`)
    status.json                     what the run is doing or how it ended: running | finished | preempted | failed,
                                    at which step, why, and the steps it was resumed at (`write_status`)
    metrics.jsonl                   one JSON object per logged step, rank 0 (`MetricsLog`; `step` = steps done)
    sparsity_masks.jsonl            per logged step, each 2:4 layer's mask flip rate, pruned share of |W| and
                                    gradient-to-weight ratio of the pruned entries (`training.sparsity_monitor`)
    log.txt                         the log of every (re)start, for people (read only for runs older than status.json)
    sparsity_decisions.json         what the sparse backends decided by timing (`sparsity.decisions()`: auto's choice
                                    per GEMM shape, cuSPARSELt algorithms, weight-gradient path), rank 0
    checkpoints/step_XXXXXXXX.pt    resumable checkpoints (+ `.sha256`; `.corrupt` once set aside as unreadable)
    eval/step_XXXXXXXX/teacher_backbone.pth   the periodic teacher exports
    teacher_backbone.pth            the final teacher, once trained to the end
    student_backbone.pth            the final student backbone as well, with train.export_student=true (probe it with
                                    eval_linear.py checkpoint=<run>/student_backbone.pth)
    eval_linear.json                its linear probe (`eval_linear.py`); the baselines in eval_linear_<name>.json
    jobs.json                       the Slurm launcher's job record (`slurm/sweep.py`), for launched runs
    .lock                           held (flock) by the training process of rank 0 while it runs (`run_lock`), whatever
                                    the command (a finished run, `train.resume=false`), and by eval_linear.py while
                                    it writes here: see `run_guard`

Steps are counted as steps done everywhere: a checkpoint's number, the teacher export's and status's `step`, and
(since metrics format 2) a metrics line's `step`; a run's last line says `"step": total_steps`. Lines written
before carry no `format` key and counted from 0; `steps_done` reads both, so older run directories stay readable
(`results/` holds some), and so does their status, inferred from `log.txt` where no `status.json` exists.

Torch-free: the tables (`reporting`) and `slurm/launch.py status` read run directories without importing torch.
Every write is atomic (`models.atomic_io`), except the metrics line appended per logged step (a line cut by a kill
mid-write is skipped by the readers and dropped on resume).
"""

import errno
import json
import math
import os
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from models.atomic_io import atomic_write_text
from models.json_text import parse_json

CONFIG = "config.yaml"
RUN_INFO = "run_info.json"
STATUS = "status.json"
METRICS = "metrics.jsonl"
SPARSITY_MASKS = "sparsity_masks.jsonl"  # per-layer mask statistics, one line per logged step (like metrics.jsonl)
LOG = "log.txt"
CHECKPOINTS = "checkpoints"
TEACHER = "teacher_backbone.pth"
STUDENT = "student_backbone.pth"  # the final student backbone, with train.export_student=true
SPARSITY_DECISIONS = "sparsity_decisions.json"  # what the sparse backends decided by timing
EVAL_DIR = "eval"
LOCK = ".lock"

CHECKPOINT_NAME = re.compile(r"^step_(\d{8})\.pt$")
CORRUPT_SUFFIX = ".corrupt"  # an unreadable checkpoint set aside: out of the rotation, never deleted

FORMAT_KEY = "format"  # metrics.jsonl: absent (format 1) = `step` counted from 0; 2 = steps done
METRICS_FORMAT = 2
# Fields that measure the machine rather than the computation; they differ between otherwise identical runs.
TIMING_FIELDS = ("images_per_s", "step_time_s", "data_time_s", "time", "max_mem_mb")

RUNNING, FINISHED, PREEMPTED, FAILED = "running", "finished", "preempted", "failed"


# ----------------------------------------------------------------- names
def eval_result_name(knn_only: bool = False, suffix: str = "") -> str:
    """An eval_linear.py result file: `eval_linear<suffix>.json`, or `eval_knn<suffix>.json` for a k-NN-only one
    (suffix: a baseline's, or `_step_XXXXXXXX` for another checkpoint than the final teacher)."""
    return f"{'eval_knn' if knn_only else 'eval_linear'}{suffix}.json"


def is_eval_result_name(name: str) -> bool:
    """Whether `name` is one of the names `eval_result_name` gives."""
    return name.startswith(("eval_linear", "eval_knn")) and name.endswith(".json")


EVAL_RESULT = eval_result_name()  # the final teacher's linear probe: what the tables read
BASELINE_SUFFIXES = {"random_init": "_random_init", "pixels": "_pixels"}  # the untrained network, raw pixels
# baseline key -> its result files, first found wins
BASELINE_RESULTS = {key: (eval_result_name(False, suffix), eval_result_name(True, suffix))
                    for key, suffix in BASELINE_SUFFIXES.items()}


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).is_file() or (Path(path) / METRICS).is_file()


def last_step(cfg) -> int:
    """The step a run stops at: `cfg.total_steps`, or `train.max_steps` where that cuts the schedule short."""
    total = cfg.total_steps
    return min(total, cfg.train.max_steps) if cfg.train.max_steps > 0 else total


def nothing_left_at(run_dir: Path, step: int, last: int, total: int) -> bool:
    """Whether a run whose checkpoint is at `step` has nothing left to do: it is at its last step (`last_step`) and,
    for a full run (`last` = `total`), its final teacher is exported. Such a run is not restarted or rewritten."""
    return step >= last and (last < total or (Path(run_dir) / TEACHER).exists())


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}.pt"


def checkpoint_step(path: Path, suffix: str = "") -> Optional[int]:
    """The step of a checkpoint file name (`step_XXXXXXXX.pt` + `suffix`), None for anything else (digests, `.tmp`,
    strays, and `.corrupt` ones unless that is the suffix asked for)."""
    name = Path(path).name
    if suffix:
        if not name.endswith(suffix):
            return None
        name = name[: -len(suffix)]
    match = CHECKPOINT_NAME.match(name)
    return int(match.group(1)) if match else None


def list_checkpoints(directory: Path, suffix: str = "") -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints in a checkpoints folder, oldest first; [] if there is no such folder.
    `suffix=CORRUPT_SUFFIX`: those set aside as unreadable instead. Only regular files (or links to them): a FIFO or
    a device named like a checkpoint is none, since opening it would block its reader."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((step, p) for p in directory.iterdir()
                  if (step := checkpoint_step(p, suffix)) is not None and p.is_file())


def newest_checkpoint(run_dir: Path) -> Optional[tuple[int, Path]]:
    found = list_checkpoints(checkpoint_dir(run_dir))
    return found[-1] if found else None


def teacher_export_path(run_dir: Path, step: int) -> Path:
    """Where the teacher of `step` is exported during training (the final one is `<run>/teacher_backbone.pth`)."""
    return Path(run_dir) / EVAL_DIR / f"step_{step:08d}" / TEACHER


# ----------------------------------------------------------------- metrics.jsonl
def steps_done(record: dict) -> int:
    """Optimizer steps done when `record` (a metrics.jsonl line) was logged, whatever its format."""
    step = int(record["step"])
    return step if record.get(FORMAT_KEY, 1) >= 2 else step + 1


def _parsed(line: str) -> Optional[dict]:
    """A metrics line's record, None for a line cut by a kill mid-write (or anything else that is not one)."""
    try:
        record = parse_json(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl as written (`step` in the file's own format), unparsable lines skipped;
    FileNotFoundError if there is no such file."""
    # bytes that are not UTF-8 (a damaged or foreign file) spoil their line only, which is then skipped
    lines = Path(path).read_bytes().decode("utf-8", "replace").splitlines()
    return [r for line in lines if line.strip() and (r := _parsed(line)) is not None]


def metrics_by_steps_done(path: Path) -> list[dict]:
    """The records with `step` read as steps done (older lines converted by `steps_done`). A step going backwards
    means the run restarted there (train.py truncates the file when it resumes, but files written by older versions
    may repeat steps): the later lines replace the earlier ones from that step on."""
    records: list[dict] = []
    for record in read_metrics(path) if Path(path).is_file() else []:
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
    """Appends metrics.jsonl lines (`enabled`: the one rank that writes). On resume, lines for steps the checkpoint
    does not cover are dropped first (`truncate_after`): the resumed run logs them again, so an interrupted-then-
    resumed run leaves the same file as an uninterrupted one."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Keep only lines logged with at most `step` steps done (those a run resumed at `step` will not log
        again); 0 empties the file. Everything after a cut line goes too."""
        if not self.enabled or not (self.path.exists() or self.path.is_symlink()):
            return
        if self.path.is_symlink():  # never read or write another file through a link planted in the run
            raise RunDirProblem(f"{self.path} is a symlink: a run's metrics are a file of its own; remove the link")
        kept = []
        for line in self.path.read_text().splitlines():
            record = _parsed(line)
            if record is None or steps_done(record) > step:
                break
            kept.append(line)
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))  # a kill here keeps the old file

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({k: _plain(v) for k, v in record.items()})
        with open_append(self.path) as f:
            f.write(line + "\n")
            f.flush()


def open_append(path: Path):
    """`path` opened to append text, created if absent; never through a symlink (`RunDirProblem`, naming it), so
    the run's appended files (metrics.jsonl, log.txt) cannot be redirected outside it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise RunDirProblem(f"{path} is a symlink: the run appends to a file of its own, never through a link; "
                            "remove the link") from None
    return os.fdopen(fd, "a")


# ----------------------------------------------------------------- config, run info, decisions and status
def write_config(run_dir: Path, yaml_text: str) -> None:
    atomic_write_text(Path(run_dir) / CONFIG, yaml_text)


def write_run_info(run_dir: Path, info: dict) -> None:
    atomic_write_text(Path(run_dir) / RUN_INFO, json.dumps(info, indent=1) + "\n")


def write_sparsity_decisions(run_dir: Path, decisions: dict, unless: str = "") -> str:
    """sparsity_decisions.json, unless its text would be `unless` (what was last written); returns the text."""
    text = json.dumps(decisions, indent=1, default=str) + "\n"
    if text != unless:
        atomic_write_text(Path(run_dir) / SPARSITY_DECISIONS, text)
    return text


def read_json(path: Path) -> Optional[dict]:
    """A JSON object file of the run directory; None if absent or unreadable (a table never raises for one). Only
    a regular file is opened: a FIFO planted there would block the reader."""
    if not Path(path).is_file():
        return None
    try:
        value = parse_json(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class RunStatus:
    """How a run stands. `state`: running | finished | preempted | failed, or "" when unknown (an old run directory
    whose log says nothing). A `running` run whose process was killed (SIGKILL, out of memory, a lost node) stays
    `running`: nothing is left to record it. `recorded`: read from status.json (False: inferred from an old log)."""

    state: str = ""
    step: Optional[int] = None  # steps done when the state was recorded
    reason: str = ""  # a failure's exception, e.g. "TrainingDiverged: non-finite loss at step 41 (...)"
    resumed_at: list[int] = field(default_factory=list)  # steps the run was resumed at, in order
    time: str = ""
    recorded: bool = True
    run_id: str = ""  # made at the run's fresh start; every checkpoint it writes carries it (`new_run_id`)


def new_run_id() -> str:
    """A run's identity, made when it starts at step 0: 16 hex digits."""
    return secrets.token_hex(8)


def write_status(run_dir: Path, state: str, step: int, reason: str = "", resumed_at: Optional[list[int]] = None,
                 run_id: str = "") -> RunStatus:
    """Record the run's state (rank 0: at start, finish, preemption and failure)."""
    if state not in (RUNNING, FINISHED, PREEMPTED, FAILED):
        raise ValueError(f"unknown run state {state!r}")
    status = RunStatus(state, step, reason, list(resumed_at or []), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       run_id=run_id)
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
    """The disk is full (no room for a temporary file): rewrite the existing small file in place, in its blocks,
    so that the run's state still says `failed` and why. Not atomic; used only where the atomic write cannot be."""
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
    """The `resumed_at` of a run (re)starting at `start_step`: the earlier resumptions it keeps (those before the
    step it continues from; the metrics after it are rewritten too), then this one."""
    return [s for s in previous.resumed_at if s < start_step] + ([start_step] if resumed else [])


def read_status(run_dir: Path) -> RunStatus:
    """The run's status.json, or for older run directories what their log.txt says."""
    record = read_json(Path(run_dir) / STATUS)
    if record is None:
        return _status_from_old_log(Path(run_dir) / LOG)
    step = record.get("step")
    return RunStatus(state=str(record.get("state", "")), step=step if isinstance(step, int) else None,
                     reason=str(record.get("reason", "")),
                     resumed_at=[s for s in record.get("resumed_at") or [] if isinstance(s, int)],
                     time=str(record.get("time", "")), run_id=str(record.get("run_id", "")))


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$")
_RESUMED = re.compile(r"^resumed at step (\d+)")
_OLD_PREEMPTED = re.compile(r"^SIGTERM: checkpoint saved at step (\d+)")


def _status_from_old_log(path: Path) -> RunStatus:
    """Runs written before status.json: the last log event tells a failure (ERROR / CRITICAL) or a preemption (the
    trainer's "SIGTERM: checkpoint saved at step N"); "resumed at step N" lines give the resumptions."""
    status = RunStatus(recorded=False)
    if not path.is_file():
        return status
    events = [m for line in path.read_text(errors="replace").splitlines() if (m := _LOG_LINE.match(line))]
    status.resumed_at = [int(r.group(1)) for m in events if (r := _RESUMED.match(m.group("message")))]
    if events:
        level, message = events[-1].group("level"), events[-1].group("message")
        if level in ("ERROR", "CRITICAL"):
            status.state, status.reason = FAILED, message
        elif preempted := _OLD_PREEMPTED.match(message):
            status.state, status.step = PREEMPTED, int(preempted.group(1))
    return status


# ----------------------------------------------------------------- problems of the directory's entries

class RunDirProblem(RuntimeError):
    """An entry of the run directory is not what the run needs (`checkpoints` not a usable directory, `.lock` not a
    regular file): refused, naming the path, instead of being read as absent."""
