"""Torch files of a run: saved atomically with their SHA-256, loaded without running code.

- `save_verified(obj, path)`: `torch.save` streamed through SHA-256, written atomically
  (`rundir.atomic`); the digest goes to `<path>.sha256` (`rundir.digests`), atomically too, before
  the file itself is renamed into place.
- `load_verified(path)`: checks the digest when there is one (a file with a flipped block is
  refused, naming it: `CorruptFile`), then `torch.load(weights_only=True)` and nothing else: no
  fallback to full unpickling. Only plain containers, tensors and numbers load, plus
  `ALLOWED_GLOBALS` (what real timm/dinov2 training checkpoints hold); anything else is refused
  naming the objects it would have built (`UnsafeFile`).
- A missing digest: a dict saved by `save_verified` carries `DIGEST_MARKER` inside it, so a file
  that says it was written with a digest and has none is refused (`MissingDigest`, naming the digest
  file), whoever loads it. Files without the marker (older versions, other code: pretrained weights)
  load weights-only, unless the caller says they must be this run's (`expect_digest=True`: refused,
  with `allow_missing_digest=True` the logged opt-in).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write_text, write_atomically
from .digests import CorruptFile, MissingDigest, UnsafeFile, digest_path, verify

logger = logging.getLogger(__name__)

DIGEST_MARKER = (
    "saved_with_digest"  # in every dict save_verified writes (removed again by load_verified)
)
ALLOWED_GLOBALS = [argparse.Namespace]  # timm's train.py stores its args in checkpoints


class _HashingWriter(io.RawIOBase):
    """Hashes what torch.save writes; keeps the OSError of a failed write (torch reports it only as
    a RuntimeError "file write failed", without the errno a full disk is recognised by)."""

    def __init__(self, f, sha):
        self.f, self.sha = f, sha
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = e
            raise


def save_verified(obj: Any, path: Path | str) -> str:
    """torch.save `obj` to `path` atomically with its SHA-256 in `<path>.sha256`; returns the hex
    digest. A dict gets `DIGEST_MARKER` (in a copy): the file itself then says that a missing digest
    is a loss, not an old file."""
    path = Path(path)
    sha = hashlib.sha256()
    if isinstance(obj, dict):
        obj = {**obj, DIGEST_MARKER: True}

    def write(f):
        writer = _HashingWriter(f, sha)
        try:
            torch.save(obj, writer)
        except RuntimeError as e:
            # the write's own error (ENOSPC, EIO, ...), not torch's wrapper of it
            if writer.error is not None:
                raise writer.error from e
            raise

    write_atomically(
        path,
        write,
        before_rename=lambda: atomic_write_text(
            digest_path(path), f"{sha.hexdigest()}  {path.name}\n"
        ),
    )
    return sha.hexdigest()


def load_verified(
    path: Path | str,
    map_location: Any = "cpu",
    *,
    expect_digest: bool = False,
    allow_missing_digest: bool = False,
) -> Any:
    """The object in `path`, digest-checked, loaded weights-only (see the module docstring). Without
    a digest: refused if the file carries `DIGEST_MARKER`, or if `expect_digest` (a run's own file)
    unless `allow_missing_digest` (an explicit opt-in for files of older versions; logged)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    checked = verify(path)
    obj = _load(path, map_location)
    marked = isinstance(obj, dict) and obj.pop(DIGEST_MARKER, False) is True
    if checked:
        return obj
    if marked:
        raise MissingDigest(
            path,
            f"was written with a SHA-256 digest and its digest file {digest_path(path)} is "
            "missing: it cannot be checked, so it is refused (restore the digest file with "
            "the checkpoint, or use a copy that has one)",
        )
    if expect_digest and not allow_missing_digest:
        raise MissingDigest(
            path,
            f"has no digest file ({digest_path(path)}): this version writes one for every "
            "checkpoint, so it was lost or the file comes from an older version; refused "
            "unless loading unverified files is allowed explicitly",
        )
    if expect_digest:
        logger.warning(
            "loading %s without a digest (allowed explicitly): it cannot be checked for damage",
            path,
        )
    return obj


def _load(path: Path, map_location: Any) -> Any:
    try:
        return _weights_only_load(path, map_location)
    except Exception as e:  # noqa: BLE001 - classified below; never retried with full unpickling
        unsafe = _unsafe_globals(path)
        if unsafe:
            raise UnsafeFile(
                path,
                f"holds pickled objects that only arbitrary code could rebuild "
                f"({', '.join(unsafe[:5])}); refused (only tensors, numbers and plain containers "
                "load). Re-save its state dict with torch.save(model.state_dict(), ...)",
            ) from None
        # (torch's own message suggests weights_only=False: exactly what must not be done with an
        # unknown file)
        raise CorruptFile(
            path,
            f"is not a readable PyTorch checkpoint (not written by torch.save, or damaged; "
            f"{type(e).__name__})",
        ) from None


def _weights_only_load(path: Path, map_location: Any) -> Any:
    if hasattr(torch.serialization, "safe_globals"):
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    torch.serialization.add_safe_globals(
        ALLOWED_GLOBALS
    )  # torch < 2.5: the allow-list is process-wide there
    return torch.load(path, map_location=map_location, weights_only=True)


def _unsafe_globals(path: Path) -> list[str]:
    if not hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"):  # torch < 2.5
        return ["(objects this torch cannot list)"]
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a zip checkpoint at all
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in ALLOWED_GLOBALS}
    return [g for g in found if g not in allowed]
