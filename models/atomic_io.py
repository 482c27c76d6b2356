"""Atomic file writes, torch-free (so the run-directory readers and the Slurm launcher use them without torch).

`write_atomically(path, write)`: `write(f)` into `<name>.tmp`, fsync, rename over `<name>`, fsync the directory. A
kill at any moment leaves either the old file or the new one, never a truncated one. `models.safe_io` builds its
checksummed torch writes on it; everything else a run writes (config, metrics rewrites, run info and status, eval
results, the Slurm job record) goes through `atomic_write_text`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable, Optional


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path) -> Path:
    """Where a write of `path` goes before its rename (a stray one is a write that never finished)."""
    return path.with_name(path.name + ".tmp")


def write_atomically(path: Path | str, write: Callable[[BinaryIO], None],
                     before_rename: Optional[Callable[[], None]] = None) -> None:
    """`write(f)` into `<path>.tmp`, fsync, `before_rename()`, rename over `path`, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    write_atomically(path, lambda f: f.write(data))


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode())
