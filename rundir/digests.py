"""Checksums of the files a run keeps, torch-free: `<name>.sha256` beside a checkpoint or teacher
export, and the problems a file can have (`CorruptFile`, `MissingDigest`, `UnsafeFile`: each a
`CommandError`, exit status 1).

The digest is written by `rundir.torch_files.save_verified` (atomically, before the file itself is
renamed into place, so a checkpoint never exists without its digest) and checked by `verify` here,
which the torch-free readers (the Slurm launcher's "finished", the tables' stale-result check) use
without loading the file.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .errors import CommandError

DIGEST_SUFFIX = ".sha256"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK = 16 << 20


class _FileProblem(CommandError, RuntimeError):
    def __init__(self, path, reason: str):
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


class CorruptFile(_FileProblem):
    """A file whose content does not match its recorded digest, or that cannot be parsed at all."""


class MissingDigest(CorruptFile):
    """A file that should have a digest next to it and has none: it cannot be checked, so it is not
    loaded."""


class UnsafeFile(_FileProblem):
    """A file that would need arbitrary code (pickled objects beyond plain data) to load."""


def digest_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + DIGEST_SUFFIX)


def file_digest(path: Path | str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def recorded_digest(path: Path | str) -> str | None:
    """The digest written next to `path` by `save_verified`; None where there is none (an older or
    foreign file), "" where the file is there but holds no SHA-256 (empty or damaged)."""
    side = digest_path(path)
    if not side.is_file():
        return None
    with open(
        side, "rb"
    ) as f:  # bytes: a flipped bit must read as a damaged digest, not as a decoding error
        words = f.read(4096).decode("ascii", "replace").split()
    return words[0] if words and SHA256_HEX.fullmatch(words[0]) else ""  # "": there, but unreadable


def verify(path: Path | str) -> bool:
    """True when `path` has a recorded digest and matches it; False when it has none; CorruptFile on
    a mismatch."""
    expected = recorded_digest(path)
    if expected is None:
        return False
    _check(path, expected)
    return True


def checked_digest(path: Path | str) -> str:
    """The SHA-256 of `path`, checked against its recorded digest where it has one: CorruptFile when
    that digest is damaged or does not match, so a reader that keys on the file's digest (a feature
    cache) refuses it as a loader would."""
    return _check(path, recorded_digest(path))


def _check(path: Path | str, expected: str | None) -> str:
    """`path`'s SHA-256 against `expected` (`recorded_digest`'s answer: None for no digest, "" for a
    damaged one)."""
    if expected == "":
        raise CorruptFile(
            path,
            f"has an unreadable recorded SHA-256 ({digest_path(path).name}): the digest was "
            "damaged after it was written, so the file cannot be checked",
        )
    actual = file_digest(path)
    if expected is not None and actual != expected:
        raise CorruptFile(
            path,
            f"does not match its recorded SHA-256 ({digest_path(path).name}): the file was "
            "changed or damaged after it was written",
        )
    return actual
