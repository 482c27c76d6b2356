"""Writers of hostile image trees (FIFOs, sockets, links, odd names) and a hang guard for the
hostile data tests."""

import io
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
# far above what any of these takes; a regression that blocks fails here instead of hanging CI
HANG_S = 120


def png_bytes(seed: int = 0, size: int = 12) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(
        np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    ).save(buf, "PNG")
    return buf.getvalue()


def put(path, data: bytes = None, seed: int = 0) -> None:
    """Write an image (or `data`) at `path`, a str, Path or bytes (names that are not UTF-8), making
    its folder."""
    path = os.fsencode(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(png_bytes(seed) if data is None else data)


def base_tree(root: Path, per_class: int = 2) -> Path:
    """root/train/{a,b}/img_<i>.png: readable images; returns root."""
    for c, name in enumerate("ab"):
        for i in range(per_class):
            put(root / "train" / name / f"img_{i}.png", seed=10 * c + i)
    return root


def make_fifo(path) -> None:
    os.makedirs(os.path.dirname(os.fsencode(path)), exist_ok=True)
    os.mkfifo(path)


def make_socket(path) -> socket.socket:
    """A bound Unix socket at `path` (kept open by the caller: closing it leaves the socket file in
    place anyway)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


def run_isolated(code: str, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter at the repository root, killed after `timeout` s (a hang fails
    the test)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    try:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=REPO,
            env=env,
            timeout=timeout,
            capture_output=True,
            text=True,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"hung for {timeout} s: {(e.stderr or b'')[-2000:]!r}") from None
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_clean_log(text: str) -> None:
    """No raw control character (but the newline ending each record) and no undecodable byte reached
    the log."""
    for line in text.splitlines():
        bad = [c for c in line if (not c.isprintable() and c != "\t") or 0xDC80 <= ord(c) <= 0xDCFF]
        assert not bad, f"raw {bad!r} in log line {line!r}"
