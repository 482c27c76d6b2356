"""Run files kept compressed: the committed runs under `results/` store metrics.jsonl, log.txt and
sparsity_masks.jsonl as `<name>.xz` (Python's lzma; `.gz` is read too), and every reader takes
whichever of the plain file and its compressed forms is there. A run being written keeps them plain:
training appends to them.

A compressed file that does not decompress reads as empty, as a damaged plain file reads as its
readable lines: it costs its own run's fields, never a whole table.
"""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

SUFFIXES = (".xz", ".gz")  # the first is what `scripts/experiments/study_import.py` writes


def stored(path: Path) -> Path | None:
    """The file holding `path`'s content: itself, else its `.xz` or `.gz` form; None if there is
    none."""
    path = Path(path)
    for candidate in (path, *(path.with_name(path.name + s) for s in SUFFIXES)):
        if candidate.is_file():
            return candidate
    return None


def exists(path: Path) -> bool:
    return stored(path) is not None


def read_bytes(path: Path) -> bytes:
    """`path`'s content, decompressed where it is stored compressed; FileNotFoundError if it is
    stored nowhere."""
    found = stored(path)
    if found is None:
        raise FileNotFoundError(
            f"{path}: no such file (nor {', '.join(Path(path).name + s for s in SUFFIXES)})"
        )
    if found == Path(path):  # the plain file
        return found.read_bytes()
    try:
        return (lzma if found.suffix == ".xz" else gzip).decompress(found.read_bytes())
    except (lzma.LZMAError, OSError, EOFError):  # gzip's BadGzipFile is an OSError
        return b""


def write_xz(data: bytes, path: Path) -> Path:
    """`data` as `path` + ".xz" (the form committed results keep); returns that path."""
    target = Path(path).with_name(Path(path).name + SUFFIXES[0])
    target.write_bytes(lzma.compress(data, preset=9))
    return target
