"""Every file a run writes goes through here: atomic, checksummed where it holds state, and loaded without running code.

- Atomic writes (`models.atomic_io`, torch-free): write `<name>.tmp`, fsync, rename over `<name>`, fsync the
  directory. A kill at any moment leaves either the old file or the new one, never a truncated one.
- `save_verified(obj, path)`: `torch.save` streamed through SHA-256; the digest goes to `<path>.sha256` (atomically,
  before the checkpoint itself is renamed into place, so a checkpoint never exists without its digest).
- `load_verified(path)`: checks the digest when there is one (a file with a flipped block is refused, naming it:
  `CorruptFile`), then `torch.load(weights_only=True)` and nothing else: no fallback to full unpickling. Only plain
  containers, tensors and numbers load, plus `ALLOWED_GLOBALS` (what real timm/dinov2 training checkpoints hold);
  anything else is refused naming the objects it would have built (`UnsafeFile`). Files without a digest (written by
  older versions, or by other code) load with the same weights-only rule.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
from pathlib import Path
from typing import Any, Optional

import torch

from .atomic_io import atomic_write_text, write_atomically

logger = logging.getLogger(__name__)

DIGEST_SUFFIX = ".sha256"
ALLOWED_GLOBALS = [argparse.Namespace]  # timm's train.py stores its args in checkpoints
_CHUNK = 16 << 20


class _FileProblem(RuntimeError):
    def __init__(self, path, reason: str):
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


class CorruptFile(_FileProblem):
    """A file whose content does not match its recorded digest, or that cannot be parsed at all."""


class UnsafeFile(_FileProblem):
    """A file that would need arbitrary code (pickled objects beyond plain data) to load."""


class _HashingWriter(io.RawIOBase):
    def __init__(self, f, sha):
        self.f, self.sha = f, sha

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        return self.f.write(b)


def save_verified(obj: Any, path: Path | str) -> str:
    """torch.save `obj` to `path` atomically with its SHA-256 in `<path>.sha256`; returns the hex digest."""
    path = Path(path)
    sha = hashlib.sha256()

    def write(f):
        torch.save(obj, _HashingWriter(f, sha))

    write_atomically(path, write,
                     before_rename=lambda: atomic_write_text(digest_path(path), f"{sha.hexdigest()}  {path.name}\n"))
    return sha.hexdigest()


def digest_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + DIGEST_SUFFIX)


def file_digest(path: Path | str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def recorded_digest(path: Path | str) -> Optional[str]:
    """The digest written next to `path` by `save_verified`, or None (an older or foreign file)."""
    side = digest_path(path)
    if not side.is_file():
        return None
    words = side.read_text().split()
    return words[0] if words else ""


def verify(path: Path | str) -> bool:
    """True when `path` has a recorded digest and matches it; False when it has none; CorruptFile on a mismatch."""
    expected = recorded_digest(path)
    if expected is None:
        return False
    actual = file_digest(path)
    if actual != expected:
        raise CorruptFile(path, f"does not match its recorded SHA-256 ({digest_path(path).name}): the file was "
                                "changed or damaged after it was written")
    return True


def load_verified(path: Path | str, map_location: Any = "cpu") -> Any:
    """The object in `path`, digest-checked where one is recorded, loaded weights-only (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    verify(path)
    try:
        return _weights_only_load(path, map_location)
    except Exception as e:  # noqa: BLE001 - classified below; never retried with full unpickling
        unsafe = _unsafe_globals(path)
        if unsafe:
            raise UnsafeFile(path, f"holds pickled objects that only arbitrary code could rebuild "
                                   f"({', '.join(unsafe[:5])}); refused (only tensors, numbers and plain containers "
                                   "load). Re-save its state dict with torch.save(model.state_dict(), ...)") from None
        # (torch's own message suggests weights_only=False: exactly what must not be done with an unknown file)
        raise CorruptFile(path, f"is not a readable PyTorch checkpoint (not written by torch.save, or damaged; "
                                f"{type(e).__name__})") from None


def _weights_only_load(path: Path, map_location: Any) -> Any:
    if hasattr(torch.serialization, "safe_globals"):
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    torch.serialization.add_safe_globals(ALLOWED_GLOBALS)  # torch < 2.5: the allow-list is process-wide there
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
