"""The run directory's lock: one process writes a run directory at a time (train.py's rank 0, or an
evaluation writing its results there), so that two trainers never overwrite each other's
checkpoints. An flock on `<run dir>/.lock` (`rundir.layout.LOCK`): the kernel drops it when the
holder dies, however it dies."""

import errno
import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RunDirInUse, RunDirProblem
from .layout import LOCK, LOG
from .status import read_status


@dataclass
class RunDirLock:
    """An flock on `<run dir>/.lock`, held while its descriptor stays open: the kernel drops it when
    the process dies, however it dies, so a stale lock never blocks a requeued job. `held` is False
    where the file system has no flock (`unsupported` then says why)."""

    path: Path
    held: bool
    unsupported: str = ""
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd, self.held = None, False


def lock(run_dir: Path, otherwise: str = "choose another --output-dir") -> RunDirLock:
    """Take the run directory for this process, or raise `RunDirInUse` (its message ends with
    `otherwise`, what else the refused command can do). Advisory and non-blocking. The lock file is
    created once and never written. A `.lock` that is not a regular file (a symlink, planted or not,
    a directory, a FIFO) is never opened through: `RunDirProblem`, naming it."""
    path = Path(run_dir) / LOCK
    # read-write: NFS emulates flock with write locks; NOFOLLOW: never through a link; NONBLOCK: a
    # FIFO never hangs
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise RunDirProblem(
            f"{path}: cannot open the run directory's lock file ({e.strerror or e}); it must be a "
            "regular file (not a symlink or a directory): remove it, or choose another --output-dir"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunDirProblem(
            f"{path} is not a regular file: remove it, or choose another --output-dir"
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            status = read_status(run_dir)
            since = (
                f" (its status.json: {status.state} at step {status.step}, {status.time})"
                if status.time
                else ""
            )
            raise RunDirInUse(
                f"{run_dir} is in use by another process (a trainer or an evaluation){since} (see "
                f"its {LOG}); wait for it to end or stop it (a dead process holds no lock)"
                + (f", or {otherwise}" if otherwise else "")
            ) from None
        # e.g. Lustre mounted without flock: ENOSYS / EOPNOTSUPP / ENOLCK
        return RunDirLock(path, held=False, unsupported=f"{e.strerror or e} on {path}")
    return RunDirLock(path, held=True, _fd=fd)
