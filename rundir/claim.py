"""A trainer's hold on its run directory (train.py's rank 0), taken before it reads or writes
anything there: the directory's lock, the lock of a `checkpoints` folder linked to elsewhere (that
folder is this run's too, for as long as it runs), and the checks a writer makes before its first
write (`rundir.guard`). On a refusal every lock taken is released again, so nothing is left held or
written."""

from dataclasses import dataclass
from pathlib import Path

from .errors import RunDirProblem
from .guard import (
    appended_file_problem,
    eval_dir_problem,
    lost_checkpoints_problem,
    remove_stray_temporaries,
    usable_checkpoint_dir,
)
from .layout import CHECKPOINTS, checkpoint_dir
from .lock import RunDirLock, lock


@dataclass
class ClaimedRunDir:
    run_dir: Path
    run_lock: RunDirLock
    checkpoints_lock: RunDirLock | None = None  # where `checkpoints` links to a folder elsewhere

    @property
    def held(self) -> bool:
        """False where the file system has no flock (`unsupported` says why): nothing guards the
        directory then."""
        return self.run_lock.held

    @property
    def unsupported(self) -> str:
        return self.run_lock.unsupported

    def remove_strays(self) -> list[Path]:
        """The temporary files trainers killed mid-write left (`guard.remove_stray_temporaries`),
        removed only where this process holds the lock: in a linked checkpoints folder only if its
        own lock is held too."""
        if not self.held:
            return []
        linked_held = self.checkpoints_lock is None or self.checkpoints_lock.held
        return remove_stray_temporaries(self.run_dir, checkpoints=linked_held)

    def release(self) -> None:
        for held in (self.checkpoints_lock, self.run_lock):
            if held is not None:
                held.release()


def claim(run_dir: Path, resume: bool) -> ClaimedRunDir:
    """Take `run_dir` (already resolved: `guard.resolve_run_dir`) for this trainer, or raise
    `RunDirInUse` / `RunDirProblem` naming what is in the way. `resume`: the run will continue its
    checkpoints (train.resume), so checkpoints recorded in status.json but gone are a refusal."""
    claimed = ClaimedRunDir(run_dir, lock(run_dir))
    try:
        if usable_checkpoint_dir(checkpoint_dir(run_dir)):
            real = checkpoint_dir(run_dir).resolve()
            if real != run_dir / CHECKPOINTS:
                claimed.checkpoints_lock = lock(
                    real,
                    otherwise="is the checkpoints folder shared with another run "
                    "directory? give each run its own",
                )
        problem = (
            appended_file_problem(run_dir)
            or eval_dir_problem(run_dir)
            or (lost_checkpoints_problem(run_dir) if resume else "")
        )
        if problem:
            raise RunDirProblem(problem)
    except BaseException:
        claimed.release()
        raise
    return claimed
