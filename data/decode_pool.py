"""Decoding a data set's images in chunks for `InMemoryImages`: in forked processes on Linux, else in
threads.

PIL holds the GIL for most of a small image's decoding (opening the file and probing its format
take longer than decoding 32 x 32 pixels), so threads barely overlap: 50,000 CIFAR-10 JPEGs take
about as long on eight threads as on one. Forked processes each decode whole chunks; the data set
reaches them through the fork (it is never pickled), the pixels come back as one array a chunk, and
the warnings a child logs for unreadable files are logged again by the parent, in chunk order, so
they reach the run's handlers as they would from a thread.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial

import numpy as np

from .corrupt import load_image, logger as corrupt_logger
from .datasets import DatasetError
from .tree import printable

CHUNK = 256  # images a task

# (dataset, on_corrupt, shape, n, chunk) of the decoding under way in forked processes: a child
# reads it from the memory it inherited
_FORKED_JOB: tuple | None = None


def default_workers() -> int:
    """The CPUs this process may run on, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cpus or 1))


def decode_chunks(
    dataset, on_corrupt: str, shape: tuple, workers: int
) -> Iterator[tuple[int, np.ndarray, list[int], list[int]]]:
    """(start, pixels (k, *shape) uint8, labels, files skipped) for images 1 .. len(dataset) - 1 in
    chunks of `CHUNK`, in order (image 0 gave `shape`). An image of another shape is a
    DatasetError; an unreadable one follows `on_corrupt` (`load_image`). More than one chunk and
    more than one worker on Linux: forked processes; else threads."""
    chunk = CHUNK
    job = (dataset, on_corrupt, shape, len(dataset), chunk)
    starts = range(1, len(dataset), chunk)
    if workers > 1 and len(starts) > 1 and sys.platform.startswith("linux"):
        yield from _in_processes(job, starts, workers)
        return
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for start, result in zip(starts, pool.map(partial(decode_range, job), starts)):
            yield (start, *result)


def decode_range(job: tuple, start: int) -> tuple[np.ndarray, list[int], list[int]]:
    """The chunk of `job` (dataset, on_corrupt, shape, n, chunk) that begins at `start`."""
    dataset, on_corrupt, shape, n, chunk = job
    stop = min(start + chunk, n)
    pixels = np.empty((stop - start, *shape), dtype=np.uint8)
    labels, skipped = [], []
    for k, i in enumerate(range(start, stop)):
        image, label, skips = load_image(dataset, i, on_corrupt)
        array = np.asarray(image)
        if array.shape != shape:
            raise DatasetError(
                f"data.in_memory=true needs images of one size: {printable(dataset.describe(i))} "
                f"is {array.shape[1]}x{array.shape[0]}, {printable(dataset.describe(0))} is "
                f"{shape[1]}x{shape[0]} (set data.in_memory=false for this dataset)"
            )
        pixels[k] = array
        labels.append(label)
        skipped.append(skips)
    return pixels, labels, skipped


def _in_processes(job: tuple, starts: range, workers: int):
    global _FORKED_JOB
    _FORKED_JOB = job
    try:
        fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(min(workers, len(starts)), mp_context=fork) as pool:
            for start, (pixels, labels, skipped, warnings) in zip(
                starts, pool.map(_decode_in_child, starts)
            ):
                for message in warnings:
                    corrupt_logger.warning("%s", message)
                yield start, pixels, labels, skipped
    finally:
        _FORKED_JOB = None


class _Messages(logging.Handler):
    def __init__(self, messages: list):
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _decode_in_child(start: int):
    """A chunk decoded in a forked child, with the warnings it logged (for the parent to log)."""
    messages: list[str] = []
    handler, propagate = _Messages(messages), corrupt_logger.propagate
    corrupt_logger.addHandler(handler)
    corrupt_logger.propagate = False
    try:
        return (*decode_range(_FORKED_JOB, start), messages)
    finally:
        corrupt_logger.removeHandler(handler)
        corrupt_logger.propagate = propagate
