"""Where GPU time goes: kernel time by category from a torch.profiler run, and the GPU's idle gaps.

Used by the benchmarks (scripts/bench_sparse.py, scripts/bench_train_step.py) to explain a speed
ratio: which kernels a sparse step adds or removes, and whether the GPU waits for the host (idle
time between kernels).

    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    summary = kernel_summary(prof, steps=1)

With host activity too (`ProfilerActivity.CPU`), `runtime_calls` lists the host's CUDA API calls
(synchronisations, allocations) and `idle_gaps` the longest waits of the GPU with what the host was
doing meanwhile.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# first matching rule wins; patterns are matched against the lower-cased kernel name
CATEGORIES: tuple[tuple[str, str], ...] = (
    (
        "communication",
        r"^nccl",
    ),  # NCCL's collectives (ncclDevKernel_AllReduce_...): before "reduce" below
    ("sparse_gemm", r"sparse_gemm|xmma_sparse|sp_mma|cusparselt"),
    ("prune_pack", r"prune|_pack_kernel"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("dense_gemm", r"gemm|nvjet|cutlass|xmma|sm90_|sm80_|wgmma|cublas|^triton_tem_"),
    (
        "fused",
        r"^triton_(poi|red|per)_",
    ),  # torch.compile (inductor) kernels: fused elementwise/reductions/norms
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("cast_copy", r"copy|cast|convert"),
    ("fill", r"fill|zero"),
    ("norm", r"layer_norm|layernorm|norm"),
    ("reduce", r"reduce|sum_|sum\b"),
)


def categorize(name: str) -> str:
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "other"


def _kernel_events(prof) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every GPU kernel / memcpy / memset the profiler saw."""
    out = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.elapsed_us() > 0:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return out


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals sorted, overlapping ones joined: disjoint intervals covering the same time."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(e - s for s, e in _merged(intervals))


def _intersection_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two merged (sorted, disjoint) interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def communication_overlap(prof, steps: int = 1) -> dict:
    """Per step, how the collectives (NCCL kernels) sit against the computation: the time some
    collective runs (`communication_ms`), the part of it with no compute kernel beside it
    (`exposed_ms`: what data parallelism adds to the step if the compute kernels ran as fast as
    alone), and the time some compute kernel runs (`compute_busy_ms`: against one process's, it
    shows compute slowed by sharing the SMs with the collectives)."""
    ev = [(categorize(n) == "communication", s, e) for n, s, e in _kernel_events(prof)]
    comm = _merged((s, e) for is_comm, s, e in ev if is_comm)
    compute = _merged((s, e) for is_comm, s, e in ev if not is_comm)
    comm_us = sum(e - s for s, e in comm)
    overlapped = _intersection_us(comm, compute)
    return {
        "communication_ms": round(comm_us / steps / 1e3, 3),
        "overlapped_ms": round(overlapped / steps / 1e3, 3),
        "exposed_ms": round((comm_us - overlapped) / steps / 1e3, 3),
        "compute_busy_ms": round(sum(e - s for s, e in compute) / steps / 1e3, 3),
    }


def kernel_summary(prof, steps: int = 1, top: int = 12) -> dict:
    """Per step: ms of kernel time by category, the span from the first kernel's start to the last
    one's end, the busy time (union of kernel intervals) and the idle time (span - busy: the GPU
    waiting for the host), kernel count, and the `top` kernels by time."""
    ev = _kernel_events(prof)
    if not ev:
        return {"kernels": 0}
    by_cat: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for name, s, e in ev:
        by_cat[categorize(name)] = by_cat.get(categorize(name), 0.0) + (e - s)
        by_name.setdefault(name, [0.0, 0])
        by_name[name][0] += e - s
        by_name[name][1] += 1
    span = max(e for _, _, e in ev) - min(s for _, s, _ in ev)
    busy = _union_us((s, e) for _, s, e in ev)
    tops = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps,
        "kernels_per_step": round(len(ev) / steps, 1),
        "span_ms": round(span / steps / 1e3, 3),
        "busy_ms": round(busy / steps / 1e3, 3),
        "idle_ms": round((span - busy) / steps / 1e3, 3),
        "by_category_ms": {
            k: round(v / steps / 1e3, 3) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])
        },
        "top_kernels": [
            {
                "name": n[:120],
                "category": categorize(n),
                "ms": round(t / steps / 1e3, 4),
                "calls": round(c / steps, 1),
            }
            for n, (t, c) in tops
        ],
    }


# --------------------------------------------------------------------------------------------------
# why the GPU waits: a profile with host (CPU) activity as well


RUNTIME_CALL = re.compile(
    r"^(cuda|cu)[A-Z]"
)  # CUDA runtime (cudaMalloc) and driver (cuLaunchKernel) API calls
BLOCKING_CALL = re.compile(
    r"synchronize|malloc|free|^cudaMemcpy$|^cuMemcpy|hostalloc|hostregister", re.I
)


def _host_events(prof) -> list[tuple[str, float, float]]:
    return [
        (e.name, float(e.time_range.start), float(e.time_range.end))
        for e in prof.events()
        if not str(getattr(e, "device_type", "")).endswith("CUDA")
    ]


def runtime_calls(prof, steps: int = 1, top: int = 15) -> list[dict]:
    """The host's CUDA runtime and driver calls per step, by host time: name, calls, ms, and whether
    the call can block the host or the device (synchronisations, allocations and frees, synchronous
    copies)."""
    by_name: dict[str, list[float]] = {}
    for name, s, e in _host_events(prof):
        if RUNTIME_CALL.match(name):
            entry = by_name.setdefault(name, [0.0, 0])
            entry[0] += e - s
            entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return [
        {
            "name": n,
            "calls": round(c / steps, 1),
            "ms": round(t / steps / 1e3, 4),
            "blocking": bool(BLOCKING_CALL.search(n)),
        }
        for n, (t, c) in ranked
    ]


def idle_gaps(prof, top: int = 10, min_us: float = 100.0, host_ops: int = 4) -> list[dict]:
    """The longest stretches with no kernel running (at least `min_us`), longest first: where they
    start (ms from the first kernel), how long, the kernels on either side, and what the host was
    doing meanwhile: the runtime calls and the host events (aten ops, compiled graphs, Python
    annotations) that overlap it, innermost first."""
    ev = sorted(_kernel_events(prof), key=lambda k: k[1])
    if not ev:
        return []
    origin = ev[0][1]
    gaps, last_end, last_name = [], ev[0][2], ev[0][0]
    for name, s, e in ev[1:]:
        if s - last_end >= min_us:
            gaps.append((last_end, s, last_name, name))
        if e > last_end:
            last_end, last_name = e, name
    gaps = sorted(gaps, key=lambda g: g[0] - g[1])[:top]
    host = _host_events(prof)
    out = []
    for start, end, before, after in gaps:
        overlap = [
            (min(e, end) - max(s, start), e - s, n) for n, s, e in host if s < end and e > start
        ]
        calls = sorted({n for _, _, n in overlap if RUNTIME_CALL.match(n)})
        # innermost first: of the events covering at least half the gap the shortest say the most (a
        # whole step covers every gap); then the others, by how much of the gap they cover
        half = (end - start) / 2
        ops = sorted(
            (o for o in overlap if not RUNTIME_CALL.match(o[2])),
            key=lambda o: (o[0] < half, o[1] if o[0] >= half else -o[0]),
        )
        names = list(dict.fromkeys(n for _, _, n in ops))[:host_ops]
        out.append(
            {
                "at_ms": round((start - origin) / 1e3, 3),
                "gap_ms": round((end - start) / 1e3, 3),
                "after_kernel": before[:80],
                "before_kernel": after[:80],
                "runtime_calls": calls,
                "host_events": names,
            }
        )
    return out
