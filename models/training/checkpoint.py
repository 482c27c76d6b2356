"""Resumable checkpoints: atomic writes, a bounded history, `weights_only=True` loading.

A checkpoint is written to `<name>.tmp`, flushed to disk and renamed over its final name, so a kill during the
save leaves the previous checkpoints intact and at worst a stray `.tmp` file (ignored and removed on resume).
"""

import logging
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^step_(\d{8})\.pt$")


def atomic_save(obj: Any, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """`<run>/checkpoints/step_XXXXXXXX.pt`, newest `max_to_keep` kept."""

    def __init__(self, directory: Path, max_to_keep: int):
        self.directory = Path(directory)
        self.max_to_keep = max_to_keep

    def path_for(self, step: int) -> Path:
        return self.directory / f"step_{step:08d}.pt"

    def checkpoints(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if _NAME.match(p.name)]
        return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))

    def save(self, state: dict, step: int) -> Path:
        path = self.path_for(step)
        atomic_save(state, path)
        for old in self.checkpoints()[: -self.max_to_keep]:
            old.unlink(missing_ok=True)
        logger.info("saved checkpoint %s", path)
        return path

    def load_latest(self) -> Optional[dict]:
        """The newest readable checkpoint, or None. Unreadable ones (e.g. a disk filled mid-write before the
        atomic rename existed) are reported and skipped, never deleted."""
        for stray in self.directory.glob("*.tmp") if self.directory.is_dir() else []:
            logger.warning("removing %s: a checkpoint write that never finished", stray)
            stray.unlink(missing_ok=True)
        for path in reversed(self.checkpoints()):
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - any unreadable file: fall back to the previous one
                logger.error("cannot read checkpoint %s (%s): trying the previous one", path, e)
                continue
            logger.info("resuming from %s", path)
            return state
        return None
