"""Resumable checkpoints: atomic, checksummed writes (`rundir.torch_files`), a bounded history,
weights-only loading.

A checkpoint `step_XXXXXXXX.pt` is written to a temporary file streamed through SHA-256, its digest
goes to `<name>.sha256`, then it is renamed into place: a kill during the save leaves the previous
checkpoints intact and at worst a stray temporary file (removed by the next lock holder:
`rundir.guard.remove_stray_temporaries`). On resume the newest checkpoint whose digest matches is
used. One that does not (a flipped block, a truncated copy) is reported and moved aside as
`<name>.corrupt` (never deleted, and out of the rotation, which would otherwise count it as the
newest); the previous one is tried. One without its digest file is refused and the run stops
(`MissingDigest`: nothing moved; `allow_missing_digest` is the explicit opt-in for checkpoints of
versions that wrote none). If checkpoints exist but none is readable the run stops
(`NoReadableCheckpoint`) instead of silently starting over on top of its own history, and so does a
`checkpoints` entry that is not a usable directory (`RunDirProblem`).
"""

import logging
import os
from pathlib import Path

from .digests import CorruptFile, MissingDigest, UnsafeFile, digest_path
from .errors import CommandError
from .guard import usable_checkpoint_dir
from .layout import CORRUPT_SUFFIX, checkpoint_name, list_checkpoints
from .torch_files import load_verified, save_verified

logger = logging.getLogger(__name__)


class NoReadableCheckpoint(CommandError, RuntimeError):
    """The run directory holds checkpoints, and none of them can be read."""


class CheckpointManager:
    """`<run>/checkpoints/step_XXXXXXXX.pt`, newest `max_to_keep` kept. `writer`: the one rank that
    writes and moves unreadable checkpoints aside (the others only read). `allow_missing_digest`:
    load checkpoints without a digest file (older versions), logged; off, they are refused."""

    def __init__(
        self,
        directory: Path,
        max_to_keep: int,
        writer: bool = True,
        allow_missing_digest: bool = False,
    ):
        self.directory = Path(directory)
        self.max_to_keep = max_to_keep
        self.writer = writer
        self.allow_missing_digest = allow_missing_digest

    def path_for(self, step: int) -> Path:
        return self.directory / checkpoint_name(step)

    def checkpoints(self) -> list[Path]:
        """Oldest first (the names the run-directory format gives checkpoints; anything else is
        ignored)."""
        return [path for _, path in list_checkpoints(self.directory)]

    def save(self, state: dict, step: int) -> Path:
        path = self.path_for(step)
        save_verified(state, path)
        # only older ones go, oldest first: never the one just written, never a file with a later
        # step
        older = [p for s, p in list_checkpoints(self.directory) if s < step]
        for old in older[: max(0, len(older) + 1 - self.max_to_keep)]:
            old.unlink(missing_ok=True)
            digest_path(old).unlink(missing_ok=True)
        logger.info("saved checkpoint %s", path)
        return path

    def load_latest(self) -> dict | None:
        """The newest readable checkpoint, or None when there is none at all (see the module
        docstring)."""
        # absent: none at all; not a usable directory: refused
        if not usable_checkpoint_dir(self.directory):
            return None
        failures = []
        for path in reversed(self.checkpoints()):
            try:
                state = load_verified(
                    path, expect_digest=True, allow_missing_digest=self.allow_missing_digest
                )
            except MissingDigest:
                # not damaged as far as anyone knows, only unverifiable: stop, set nothing aside
                raise
            except (
                CorruptFile,
                UnsafeFile,
                FileNotFoundError,
            ) as e:  # (gone: the writer rank set it aside)
                failures.append(f"{path.name}: {e}")
                logger.error("cannot use checkpoint %s (%s): trying the previous one", path, e)
                self._set_aside(path)
                continue
            logger.info("resuming from %s", path)
            return state
        set_aside = [p.name for _, p in list_checkpoints(self.directory, suffix=CORRUPT_SUFFIX)]
        # (set aside by an earlier attempt: still not a reason to start over)
        if failures or set_aside:
            failures = failures or [
                f"{name}: set aside earlier as unreadable" for name in set_aside
            ]
            raise NoReadableCheckpoint(
                f"{len(failures)} checkpoint(s) in {self.directory}, none readable "
                f"({'; '.join(failures)[:600]}). "
                f"Refusing to start over: that would replace this run's metrics. The unreadable "
                f"files were kept as "
                f"*{CORRUPT_SUFFIX}; restore a good copy, or use a new --output-dir to start a new "
                f"run"
            )
        return None

    def _set_aside(self, path: Path) -> None:
        if not self.writer:
            return
        for p in (path, digest_path(path)):
            if p.exists():
                os.replace(p, p.with_name(p.name + CORRUPT_SUFFIX))
