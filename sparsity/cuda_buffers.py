"""Buffers that a cache keeps across calls (a cuSPARSELt plan's workspace, a compressor's scratch,
the pruning kernel's pattern tables), allocated outside any CUDA-graph memory pool.

Under `torch.compile(mode="reduce-overhead")` inductor runs each graph's warm-up and capture with
the calling thread's allocations routed to the graph's private pool, and then checks that every live
block of that pool is one of the graph's outputs. A cached buffer made on first use inside that
window would be a live block no graph owns ("tensors in the cudagraph pool not tracked as outputs"),
and replays could overwrite it. Allocation routing is per thread, so these buffers are allocated by
a thread of their own; the caller's stream is recorded on them so that a replaced buffer is not
reused while that stream may still read it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

_lock = threading.Lock()
_allocator: ThreadPoolExecutor | None = None


def _thread() -> ThreadPoolExecutor:
    global _allocator
    with _lock:
        if _allocator is None:  # made on first use: importing the library starts no thread
            _allocator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparsity-buffers")
        return _allocator


def persistent_empty(shape, dtype: torch.dtype, device_index: int) -> torch.Tensor:
    """An uninitialised CUDA tensor that outlives the call making it, from no CUDA-graph pool."""
    device = torch.device("cuda", device_index)
    buffer = _thread().submit(torch.empty, shape, dtype=dtype, device=device).result()
    buffer.record_stream(torch.cuda.current_stream(device))
    return buffer


def persistent_copy(tensor: torch.Tensor, device_index: int) -> torch.Tensor:
    """A copy of a (small, host) tensor on the GPU that outlives the call making it, from no
    CUDA-graph pool."""
    buffer = persistent_empty(tuple(tensor.shape), tensor.dtype, device_index)
    buffer.copy_(tensor)
    return buffer
