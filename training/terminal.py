"""How long work shows progress: a tqdm bar when stderr is a terminal, plain periodic lines
otherwise.

A bar redrawn with carriage returns is one endless line in a Slurm `.err` file or a redirected log,
so off a terminal the same progress is told as a line every `every` of the total ("features:
512/1797 batches (28%)"). Torch-free, for the scripts too.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def on_terminal() -> bool:
    return sys.stderr.isatty()


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """Counts done of `total`: tqdm on a terminal; elsewhere `say(line)` each time another `every`
    of the total is done, and once at the end. `enabled=False` shows nothing."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        *,
        enabled: bool = True,
        every: float = 0.1,
        say: Callable[[str], None] = _to_stderr,
    ):
        if not 0 < every <= 1:
            raise ValueError(f"every must be in (0, 1], got {every}")
        self.total, self.desc, self.unit, self.every, self.say = total, desc, unit, every, say
        self.enabled, self.done, self._told, self._start = enabled, 0, 0, time.perf_counter()
        self.bar = (
            tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
            if enabled and on_terminal()
            else None
        )
        self._next = self._threshold(1)

    def _threshold(self, k: int) -> float:
        # the k-th share as a whole count (1e-9: 6 * 0.1 * 100 is 60.00000000000001 in floating
        # point)
        return math.ceil(k * self.every * self.total - 1e-9) if self.total else float("inf")

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and self.done >= self._next:
            self._tell()  # one line even when an update jumps over several thresholds
            self._next = self._threshold(int(self.done / (self.every * self.total) + 1e-9) + 1)

    def _tell(self) -> None:
        elapsed = time.perf_counter() - self._start
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        of = f"/{self.total}" if self.total is not None else ""
        self.say(f"{self.desc}: {self.done}{of} {self.unit}{share}, {elapsed:.0f} s")
        self._told = self.done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self._told != self.done:
            self._tell()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(
    iterable: Iterable[T],
    desc: str,
    unit: str = "it",
    *,
    total: int | None = None,
    enabled: bool = True,
    every: float = 0.1,
    say: Callable[[str], None] = _to_stderr,
) -> Iterator[T]:
    """Iterate, showing progress as `Progress` does; `total` defaults to len(iterable) when it has
    one."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Progress(total, desc, unit, enabled=enabled, every=every, say=say) as progress:
        for item in iterable:
            yield item
            progress.update()
