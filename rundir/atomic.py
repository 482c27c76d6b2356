"""Atomic file writes, torch-free (so the run-directory readers and the Slurm launcher use them
without torch).

`write_atomically(path, write)`: `write(f)` into a temporary file beside `path`, fsync, rename over
`path`, fsync the directory. A kill at any moment leaves either the old file or the new one, never a
truncated one. `rundir.torch_files` builds its checksummed torch writes on it; everything else a run
writes (config, metrics rewrites, run info and status, eval results, the Slurm job record) goes
through `atomic_write_text`.

The temporary file is `<name>.<pid>.<random>.tmp`, created exclusively (O_CREAT | O_EXCL |
O_NOFOLLOW): a name planted in the directory (a symlink pointing elsewhere, another writer's file)
is never opened, so nothing outside the directory is ever written through it, and two writers never
share one. The rename replaces whatever `path` is, a symlink included (the link goes, its target is
not touched). A stray temporary file (a writer killed before its rename; `<name>.tmp` for versions
before this one) is recognised by `temporary_base` and removed only by whoever holds the directory
(`rundir.guard.remove_stray_temporaries`, under the run-directory lock).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_SUFFIX = ".tmp"
# <base>.<pid>.<hex>.tmp (this version) or <base>.tmp (older ones): the base is the file being
# written
_TEMPORARY = re.compile(r"^(?P<base>.+?)(?:\.\d+\.[0-9a-f]{8,})?\.tmp$")
_CREATE = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path | str) -> Path:
    """A fresh temporary name for a write of `path`, beside it: `<name>.<pid>.<random>.tmp`."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(6)}{TMP_SUFFIX}")


# what `tmp_path` adds to a name at most: ".<pid>.<12 hex>.tmp" (pids are below 2**22 on Linux,
# 2**32 anywhere)
TMP_NAME_EXTRA = len(".4294967295.") + 12 + len(TMP_SUFFIX)


def _name_limits(folder: Path) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the nearest existing folder's file system; POSIX's usual 255 / 4096
    where none tells."""
    for candidate in (folder, *folder.parents):
        try:
            if candidate.is_dir():
                return os.pathconf(candidate, "PC_NAME_MAX"), os.pathconf(candidate, "PC_PATH_MAX")
        except (OSError, ValueError):  # a component too long to even look at: try the one above
            continue
    return 255, 4096


def name_problem(path: Path | str, extra: int = TMP_NAME_EXTRA) -> str:
    """Why `path` cannot be written the way every file here is, through a temporary name `extra`
    bytes longer ("" if it can): a folder name, the file name with that extra, or the whole path
    longer than its file system takes. Checked before any work: a name that fails only at the final
    rename loses the result."""
    path = Path(os.path.abspath(path))
    name_max, path_max = _name_limits(path.parent)
    for part in path.parts[1:-1]:
        if len(os.fsencode(part)) > name_max:
            return (
                f"the folder name {part[:24]}... is {len(os.fsencode(part))} bytes, over the "
                f"{name_max} its file "
                "system takes"
            )
    name_bytes = len(os.fsencode(path.name)) + extra
    if name_bytes > name_max:
        return (
            f"the file name {path.name[:24]}... with the temporary name it is written under is "
            f"{name_bytes} "
            f"bytes, over the {name_max} its file system takes"
        )
    path_bytes = len(os.fsencode(str(path))) + extra
    if path_bytes >= path_max:
        return (
            f"the path is {path_bytes} bytes with its temporary name, over the {path_max} its file "
            f"system takes"
        )
    return ""


def temporary_base(name: str) -> str | None:
    """The name of the file a temporary file was writing (`step_00000008.pt` for
    `step_00000008.pt.123.ab12cd34ef56.tmp` or the older `step_00000008.pt.tmp`), None for a name
    that is not a temporary file."""
    match = _TEMPORARY.match(name)
    return match.group("base") if match else None


def create_exclusively(path: Path) -> BinaryIO:
    """`path` opened for writing, created now by this call: FileExistsError if anything is there
    already (a file, a directory, a symlink, dangling or not), never a write through a link."""
    fd = os.open(path, _CREATE, 0o666)  # the umask applies, as for open()
    return os.fdopen(fd, "wb")


def write_atomically(
    path: Path | str,
    write: Callable[[BinaryIO], None],
    before_rename: Callable[[], None] | None = None,
) -> None:
    """`write(f)` into a temporary file created exclusively beside `path`, fsync, `before_rename()`,
    rename over `path` (replacing it, or the link it is: never writing through one), fsync the
    directory. On an error the temporary file is removed; a kill leaves it (a stray, see the module
    docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    f = create_exclusively(tmp)
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(
            missing_ok=True
        )  # ours (created exclusively above), so removing it touches no one else's file
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    write_atomically(path, lambda f: f.write(data))


def atomic_write_text(path: Path | str, text: str) -> None:
    """UTF-8 whatever the locale; a character that is not text (a path's undecodable byte) is
    written escaped."""
    atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))
