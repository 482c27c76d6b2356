"""Python's garbage collector at chosen steps instead of whenever its allocation counters say.

A full (generation-2) collection walks every Python object the process holds, and after model
building and torch.compile that is hundreds of thousands (433k for the default small model on the
CPU, before compiling; one full pass there takes ~150 ms). Left automatic, such a pass starts inside
whichever step crosses the threshold and the GPU runs dry while the host walks the heap: one source
of the spread between otherwise identical steps. As torchtitan does, automatic collection is turned
off for the training loop; the young generations are collected every `period` steps (where the pause
is small and at a known place; on several GPUs every rank pauses at the same step, so none waits in
an all-reduce for another's collection) and everything once at the start. A training step leaves no
tensor in a reference cycle (tests/training/test_gc_control.py), so no memory piles up between
collections. Data workers, forked inside the loop, turn automatic collection back on
(`data.loader.init_worker`).
"""

from __future__ import annotations

import gc


class StepGc:
    """`with StepGc(period) as step_gc:` turns automatic collection off (period > 0) for the block
    and restores it after; `step_gc.step(step)` collects generations 0 and 1 when `step` is a
    multiple of `period`. period = 0 leaves Python's automatic collection as it is."""

    def __init__(self, period: int):
        if not isinstance(period, int) or isinstance(period, bool) or period < 0:
            raise ValueError(
                f"period={period!r}: expected steps between collections (an int >= 0; 0 = "
                f"automatic)"
            )
        self.period = period
        self._was_enabled: bool | None = None

    def __enter__(self) -> StepGc:
        if self.period:
            self._was_enabled = gc.isenabled()
            gc.disable()
            # start-up's garbage (model building, compiling) goes before the first step
            gc.collect()
        return self

    def __exit__(self, *exc) -> bool:
        if self.period and self._was_enabled:
            gc.enable()
        self._was_enabled = None
        return False

    def step(self, step: int) -> None:
        if self.period and step % self.period == 0:
            gc.collect(1)
