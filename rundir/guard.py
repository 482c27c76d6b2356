"""Who may write a run directory, and what its writer checks before it writes (`rundir.layout`: the
format).

The rules:

- One writer. train.py's rank 0 takes the run-directory lock (`rundir.lock.lock`) before it reads or
  writes anything there, whatever the command says: a run with nothing left to do and
  `train.resume=false` take it too, so a second command on a directory in use is refused (exit 1)
  and changes nothing. eval_linear.py holds the same lock while it writes into the run
  (`evaluation.evaluate.evaluate_run`). Only the lock holder removes stray temporary files, and only
  those of files the trainer writes (`remove_stray_temporaries`): an evaluation's temporary file
  beside them is not the trainer's to remove.
- A run directory given through a symlink is resolved once, at the start (`resolve_run_dir`): the
  lock and every write use the resolved path, so re-pointing the link mid-run moves nothing. A link
  that leads nowhere is refused.
- "No checkpoints" only when `checkpoints` is absent, or is a readable directory without checkpoints
  (and status.json does not record a checkpointed step: `lost_checkpoints_problem`). A `checkpoints`
  symlink is followed once when it resolves to a directory (checkpoints kept on another disk); a
  dangling or looping link, a file, or an unreadable directory is a refusal naming the path
  (`usable_checkpoint_dir`), never "start over at step 0", which would truncate metrics.jsonl.
- Results belong to the teacher they were computed from. A run that starts from step 0 in a
  directory holding a previous run's final teacher or evaluations (`train.resume=false`, or nothing
  to resume) first moves them into `superseded-<UTC time>/` (`set_aside_results`): they are kept,
  never read as the new run's, and the tables mark an `eval_linear.json` whose `checkpoint_sha256`
  is not the current teacher's as stale.
- `eval/` (teacher exports, feature caches) is a real directory of the run, never a link, and so are
  its `step_*` folders (`eval_dir_problem`): writing into a planted link would put files outside the
  run directory. Unlike `checkpoints`, nothing there is large enough to need another disk.
"""

import logging
import os
import stat
import time
from pathlib import Path

from . import compressed
from .atomic import name_problem, temporary_base
from .digests import DIGEST_SUFFIX
from .errors import RunDirProblem
from .layout import (
    CHECKPOINTS,
    CONFIG,
    CORRUPT_SUFFIX,
    EVAL_DIR,
    LOG,
    METRICS,
    RUN_FILE_ROOM,
    RUN_INFO,
    SPARSITY_DECISIONS,
    SPARSITY_MASKS,
    STATUS,
    STUDENT,
    TEACHER,
    checkpoint_dir,
    checkpoint_step,
    is_eval_result_name,
    list_checkpoints,
)
from .status import FINISHED, PREEMPTED, RUNNING, read_status

logger = logging.getLogger(__name__)

# What the trainer writes at the top of a run directory and in each eval/step_XXXXXXXX/ (their
# temporaries are its own)
TRAINER_FILES = {
    CONFIG,
    RUN_INFO,
    STATUS,
    METRICS,
    SPARSITY_DECISIONS,
    SPARSITY_MASKS,
    TEACHER,
    TEACHER + DIGEST_SUFFIX,
    STUDENT,
    STUDENT + DIGEST_SUFFIX,
}
EXPORT_FILES = {TEACHER, TEACHER + DIGEST_SUFFIX}


def resolve_run_dir(output_dir: Path) -> Path:
    """The run directory's real path, resolved once (see the module docstring). `RunDirProblem` for
    a symlink that leads nowhere (dangling, a loop): creating its target would write where the user
    did not look."""
    output_dir = Path(output_dir)
    too_long = name_problem(output_dir / RUN_FILE_ROOM)
    # before anything looks at it: the file system refuses such a path with a traceback
    if too_long:
        raise RunDirProblem(
            f"{str(output_dir)[:80]}...: too long for the files a run writes inside it ({too_long})"
        )
    if output_dir.is_symlink() and not output_dir.is_dir():
        raise RunDirProblem(
            f"{output_dir} is a symlink that leads to no directory (dangling, or a loop): "
            "point it at a directory, or choose another --output-dir"
        )
    try:
        return output_dir.resolve(strict=output_dir.exists())
    except (OSError, RuntimeError) as e:  # a loop in a parent's links
        raise RunDirProblem(f"{output_dir}: cannot resolve the path ({e})") from None


def usable_checkpoint_dir(entry: Path) -> bool:
    """Whether the checkpoints folder `entry` exists (False: absent, a run that never saved).
    `RunDirProblem` for anything that is not a readable directory, or a symlink to one."""
    entry = Path(entry)
    try:
        mode = os.lstat(entry).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise RunDirProblem(
            f'{entry}: cannot be examined ({e.strerror or e}); refusing to treat it as "no '
            'checkpoints"'
        ) from None
    what = ""
    if stat.S_ISLNK(mode):
        try:
            target = Path(os.path.realpath(entry, strict=True))
        except (OSError, RuntimeError):
            what = "is a symlink that leads nowhere (dangling, or a loop)"
        else:
            what = "" if target.is_dir() else f"is a symlink to {target}, which is not a directory"
    elif not stat.S_ISDIR(mode):
        what = "exists and is not a directory"
    if not what:
        try:
            os.listdir(entry)
        except OSError as e:
            what = f"cannot be read ({e.strerror or e})"
    if what:
        raise RunDirProblem(
            f"{entry} {what}: refusing to start over as if the run had no checkpoints (that would "
            "replace its metrics). Make it the run's checkpoints directory again (mount or restore "
            "it), or choose another --output-dir"
        )
    return True


def lost_checkpoints_problem(run_dir: Path) -> str:
    """Why `run_dir` must not start over although it holds no checkpoint ("" if it may): its
    status.json records a step that was checkpointed (running and preempted are recorded at
    checkpoints, finished after the last one), so they were deleted or moved, or `checkpoints` is an
    empty mount point."""
    run_dir = Path(run_dir)
    folder = run_dir / CHECKPOINTS
    if usable_checkpoint_dir(folder) and (
        list_checkpoints(folder) or list_checkpoints(folder, CORRUPT_SUFFIX)
    ):
        return (
            ""  # (checkpoints set aside as unreadable: the checkpoint manager's refusal says more)
        )
    status = read_status(run_dir)
    if (
        status.recorded
        and status.state in (RUNNING, PREEMPTED, FINISHED)
        and (status.step or 0) > 0
    ):
        return (
            f"{run_dir / STATUS} records step {status.step} ({status.state}), yet {folder} holds "
            f"no checkpoint: "
            "they were moved or deleted, or the directory is not mounted. Refusing to start over "
            "at step 0 (that "
            "would replace metrics.jsonl); restore them, or start anew with train.resume=false or "
            "in another "
            "--output-dir"
        )
    return ""


def appended_file_problem(run_dir: Path) -> str:
    """Why the run cannot append to its own files ("" if it can): metrics.jsonl or log.txt is a
    symlink (appending would write wherever it points). Checked before anything is written, so that
    status.json is not left `running` by a refusal that `rundir.metrics.open_append` would make
    later."""
    links = [
        str(Path(run_dir) / name) for name in (METRICS, LOG) if (Path(run_dir) / name).is_symlink()
    ]
    if links:
        return (
            f"{', '.join(links)}: a symlink where the run appends to a file of its own; remove it"
        )
    # a directory (or FIFO, socket) named like a file the trainer writes: the write would fail
    # mid-run, a FIFO block
    odd = [
        str(Path(run_dir) / name)
        for name in sorted(TRAINER_FILES | {LOG})
        if os.path.lexists(Path(run_dir) / name)
        and not (Path(run_dir) / name).is_symlink()
        and not (Path(run_dir) / name).is_file()
    ]
    return (
        f"{', '.join(odd)}: not a regular file where the run writes one of its own files; remove it"
        if odd
        else ""
    )


def eval_dir_problem(run_dir: Path) -> str:
    """Why the run's `eval/` folder cannot take a write ("" if it can): it, or a `step_*` folder in
    it, is a symlink (a write would land wherever it points), or `eval` is not a directory. Checked
    by the trainer (exports) and by an evaluation that caches features, before either writes
    anything."""
    evals = Path(run_dir) / EVAL_DIR
    if evals.is_symlink():
        return (
            f"{evals}: a symlink where the run keeps its teacher exports and feature caches; "
            f"remove it"
        )
    if os.path.lexists(evals) and not evals.is_dir():
        return (
            f"{evals}: not a directory where the run keeps its teacher exports and feature caches; "
            f"remove it"
        )
    if not evals.is_dir():
        return ""
    try:
        links = sorted(
            str(p) for p in evals.iterdir() if p.name.startswith("step_") and p.is_symlink()
        )
    except OSError as e:
        return f"{evals}: cannot be listed ({e.strerror})"
    return (
        f"{', '.join(links)}: a symlink where the run writes a teacher export; remove it"
        if links
        else ""
    )


def _trainer_temporary(folder: str, name: str) -> bool:
    base = temporary_base(name)
    if base is None:
        return False
    if folder == CHECKPOINTS:
        if base.endswith(DIGEST_SUFFIX):
            base = base[: -len(DIGEST_SUFFIX)]
        return checkpoint_step(Path(base)) is not None
    return base in (EXPORT_FILES if folder == EVAL_DIR else TRAINER_FILES)


def remove_stray_temporaries(run_dir: Path, checkpoints: bool = True) -> list[Path]:
    """Remove the temporary files that trainers killed mid-write left (the lock holder only: a live
    writer's file would go too). Only names the trainer writes, in the run directory, `checkpoints/`
    (unless `checkpoints` is False: a linked folder whose lock this process does not hold) and
    `eval/step_*/`; a stray symlink is removed as a link (its target is never touched); directories
    are left. Returns what was removed."""
    run_dir = Path(run_dir)
    folders = [("", run_dir)] + ([(CHECKPOINTS, run_dir / CHECKPOINTS)] if checkpoints else [])
    evals = run_dir / EVAL_DIR
    if evals.is_dir() and not evals.is_symlink():
        folders += [
            (EVAL_DIR, p) for p in sorted(evals.iterdir()) if p.is_dir() and not p.is_symlink()
        ]
    removed = []
    for kind, folder in folders:
        try:
            names = os.listdir(folder)
        # absent (a fresh run); unusable ones are refused by `usable_checkpoint_dir`
        except OSError:
            continue
        for name in names:
            path = folder / name
            if not _trainer_temporary(kind, name):
                continue
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    continue
                path.unlink()
            except FileNotFoundError:
                continue
            logger.warning("removed %s: a write that never finished", path)
            removed.append(path)
    return removed


SUPERSEDED_PREFIX = "superseded-"


def previous_results(output_dir: Path) -> list[Path]:
    """What a previous run left that a fresh start must not be read with: its final teacher and
    student (and digests), its evaluation records (`rundir.layout.eval_result_name`) and `eval/`
    (teacher exports, feature caches, their records); and where it left those or checkpoints, the
    records that describe it (config, run info, status, metrics, the sparsity logs), so that they
    travel together. (A run killed before its first checkpoint left nothing to keep: its records are
    rewritten. log.txt always stays: it is open, and says when the new run started.)"""
    try:
        entries = sorted(Path(output_dir).iterdir())
    except FileNotFoundError:
        return []
    own = {TEACHER, TEACHER + DIGEST_SUFFIX, STUDENT, STUDENT + DIGEST_SUFFIX, EVAL_DIR}
    results = [p for p in entries if p.name in own or is_eval_result_name(p.name)]
    if not results and not list_checkpoints(checkpoint_dir(Path(output_dir))):
        return []
    records = {
        CONFIG,
        RUN_INFO,
        STATUS,
        METRICS,
        SPARSITY_DECISIONS,
        SPARSITY_MASKS,
        *(name + suffix for name in (METRICS, SPARSITY_MASKS) for suffix in compressed.SUFFIXES),
    }
    return results + [p for p in entries if p.name in records]


def set_aside_results(output_dir: Path) -> Path | None:
    """Move `previous_results` into a new `superseded-<UTC time>/` folder of the run directory
    (renames within the directory: nothing is copied or lost); returns that folder, or None when
    there was nothing to move."""
    return _set_aside(previous_results(output_dir), Path(output_dir))


def set_aside_checkpoints(directory: Path) -> Path | None:
    """At a fresh start, an earlier run's checkpoints (and their digests, and those set aside as
    corrupt) into a new `superseded-<UTC time>/` folder of the checkpoints folder itself (a rename,
    also where it lives on another disk); returns that folder, or None when there were none."""
    directory = Path(directory)
    found = [
        p for _, p in list_checkpoints(directory) + list_checkpoints(directory, CORRUPT_SUFFIX)
    ]
    found += [
        p.with_name(p.name + DIGEST_SUFFIX)
        for p in found
        if p.with_name(p.name + DIGEST_SUFFIX).exists()
    ]
    return _set_aside(found, directory)


def _set_aside(found: list[Path], parent: Path) -> Path | None:
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1000):
        dest = parent / f"{SUPERSEDED_PREFIX}{stamp}{'' if n == 0 else f'-{n}'}"
        try:
            dest.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise RunDirProblem(
            f"{parent}: cannot make a folder for the previous run's files (too many "
            f"{SUPERSEDED_PREFIX}{stamp}* folders)"
        )
    for path in found:
        os.rename(path, dest / path.name)
    return dest
