"""Timing for the benchmarks, built on the library's CUDA-event timers (`sparsity.backends.timing`:
one copy).

median_ms(fn, sets)   median of CUDA-event times of fn(i), i rotating over `sets` input sets (so
that nothing is
                      served from L2), after warm-up
graph_ms(step, sets)  the same for step(i) captured once per input set as a CUDA graph and replayed
graph_ms_in_turns(rows, sets, rounds)  graph_ms of several steps taking turns, each one's median round
capture_graphs(step, sets)  those graphs (warm-up on a side stream, then one capture per input set)
wall_ms(fn)           mean wall-clock milliseconds per fn() (host time: the GPU synchronised before
and after) time_steps(trainer)   CUDA-event milliseconds of each of a trainer's steps, run back to
back as training runs GcLog()               the Python garbage collections inside a `with` block:
generation and host milliseconds StepLog(gc_log)       per step: host milliseconds (and of them
waiting for the GPU), the thread's CPU
                      milliseconds and context switches, cudaMalloc calls and retries of the caching allocator,
                      GC ms
heat(step, seconds)   call step() for that long: the GPU reaches the clock it will hold under this
load
"""

from __future__ import annotations

import gc
import itertools
import resource
import statistics
import time

import torch

from sparsity.backends.timing import device_only_ms, median_cuda_ms

__all__ = [
    "MID_TRAINING_STEP",
    "GcLog",
    "StepLog",
    "capture_graphs",
    "device_only_ms",
    "graph_ms",
    "graph_ms_in_turns",
    "heat",
    "median_cuda_ms",
    "median_ms",
    "time_steps",
    "wall_ms",
]


def median_ms(fn, sets: int = 1, warm: int = 5, reps: int = 30) -> float:
    """Median CUDA-event milliseconds of fn(i) over `reps` calls after `warm`, i = 0, 1, ... modulo
    `sets`."""
    calls = itertools.count()
    return median_cuda_ms(lambda: fn(next(calls) % sets), warm, reps)


def capture_graphs(step, sets: int, warm: int = 3) -> list:
    """step(i) captured once per input set i as a CUDA graph, after `warm` calls on a side stream
    (lazy set-up outside the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(warm):
            step(i % sets)
    torch.cuda.current_stream().wait_stream(s)
    graphs = []
    for i in range(sets):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(i)
        graphs.append(g)
    return graphs


def graph_ms(step, sets: int, warm: int = 3, reps: int = 30) -> float:
    """Capture step(i) once per input set i, replay round-robin: median milliseconds per replay."""
    graphs = capture_graphs(step, sets, warm)
    return median_ms(lambda i: graphs[i].replay(), sets, warm, reps)


def graph_ms_in_turns(rows: dict, sets: int, rounds: int) -> dict:
    """`graph_ms` of each of `rows` (name -> step(i)), the rows taking turns `rounds` times, so that
    each meets the GPU as warm as the others; per row the upper median of its rounds (one of the
    measured values), in milliseconds."""
    times = {name: [] for name in rows}
    for _ in range(rounds):
        for name, step in rows.items():
            times[name].append(graph_ms(step, sets))
    return {name: statistics.median_high(t) for name, t in times.items()}


def wall_ms(fn, warm: int = 3, iters: int = 20) -> float:
    """Mean wall-clock milliseconds per fn() over `iters` calls after `warm`, the GPU synchronised
    around them."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


# the schedules' step every benchmark times at: mid-training in the ViT-L recipe (last layer
# unfrozen, lr > 0)
MID_TRAINING_STEP = 20_000


def time_steps(
    trainer, batch, warmup: int, iters: int, step: int = MID_TRAINING_STEP, after_step=None
) -> list[float]:
    """CUDA-event milliseconds of `iters` training steps (`Trainer.train_step` on `batch`) after
    `warmup`, with the schedules' values at `step` (by default a mid-training point of the ViT-L
    recipe: last layer unfrozen, lr > 0). `after_step()`, if given, runs after every step, as the
    training loop's own work between steps does."""
    values = trainer.schedules.at(step)
    after_step = after_step or (lambda: None)
    for _ in range(warmup):
        trainer.train_step(batch, values)
        after_step()
    trainer.settle_checks()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for start, end in events:  # back to back, as training runs: the host may queue ahead of the GPU
        start.record()
        trainer.train_step(batch, values)
        end.record()
        after_step()
    trainer.settle_checks()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


class GcLog:
    """`with GcLog() as log:` records each Python garbage collection in the block (generation, host
    ms); `log.summary()` gives collections per generation, the total and the longest pause."""

    def __init__(self):
        self.events: list[tuple[int, float]] = []
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.events.append((info["generation"], (time.perf_counter() - self._start) * 1e3))

    def __enter__(self) -> GcLog:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> bool:
        gc.callbacks.remove(self._callback)
        return False

    def summary(self) -> dict:
        return {
            "collections": {f"gen{g}": sum(1 for e in self.events if e[0] == g) for g in (0, 1, 2)},
            "ms": round(sum(ms for _, ms in self.events), 3),
            "max_ms": round(max((ms for _, ms in self.events), default=0.0), 3),
        }


class StepLog:
    """What happened on the host in each step, for finding the cause of a slow one: `mark()` after
    every step records the host milliseconds since the previous mark, of them the milliseconds spent
    waiting for the GPU inside functions wrapped by `waiting` (the trainer's read of the previous
    step's flags), the calling thread's CPU milliseconds and its voluntary / involuntary context
    switches (on Linux; a step whose wall time runs far past its CPU time, with involuntary
    switches, was taken off the CPU by the OS), the caching allocator's new cudaMalloc calls and its
    retries (a retry frees cached blocks, which synchronises the device), and the milliseconds of
    the collections `gc_log` saw in between. `last(n)` gives the last n steps' values as lists
    aligned with the step times."""

    def __init__(self, gc_log: GcLog):
        self.gc_log = gc_log
        self.rows: list[tuple] = []
        self._waited = 0.0
        self._last = self._now()

    def _now(self) -> tuple:
        stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
        return (
            time.perf_counter(),
            self._waited,
            time.thread_time(),
            *_thread_switches(),
            stats.get("num_device_alloc", 0),
            stats.get("num_alloc_retries", 0),
            len(self.gc_log.events),
        )

    def waiting(self, fn):
        """`fn`, with the host time of its calls counted as waiting (per step: `wait_ms`)."""

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._waited += time.perf_counter() - start

        return timed

    def mark(self) -> None:
        now = self._now()
        before, gc0, gc1 = self._last, self._last[-1], now[-1]
        gc_ms = sum(ms for _, ms in self.gc_log.events[gc0:gc1])
        wall, wait, cpu, vol, invol, alloc, retry = (b - a for a, b in zip(before[:-1], now[:-1]))
        self.rows.append((wall * 1e3, wait * 1e3, cpu * 1e3, vol, invol, alloc, retry, gc_ms))
        self._last = now

    def last(self, n: int) -> dict:
        rows = self.rows[-n:] if n else []
        columns = (
            "host_ms",
            "wait_ms",
            "cpu_ms",
            "voluntary_switches",
            "involuntary_switches",
            "cuda_mallocs",
            "alloc_retries",
            "gc_ms",
        )
        return {
            name: [round(r[i], 2) if name.endswith("_ms") else r[i] for r in rows]
            for i, name in enumerate(columns)
        }


def _thread_switches() -> tuple[int, int]:
    """The calling thread's voluntary and involuntary context switches so far (0, 0 where the OS has
    no per-thread count)."""
    if not hasattr(resource, "RUSAGE_THREAD"):
        return 0, 0
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_nvcsw, usage.ru_nivcsw


def heat(step, seconds: float) -> int:
    """Call step() until `seconds` have passed (the GPU synchronised at the end); returns the number
    of calls."""
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end or calls == 0:
        step()
        calls += 1
        if calls % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return calls
