"""Where GPU time goes: kernel time by category from a torch.profiler run, and the GPU's idle gaps.

Used by the benchmarks (scripts/bench_sparse.py, scripts/bench_train_step.py) to explain a speed ratio: which
kernels a sparse step adds or removes, and whether the GPU waits for the host (idle time between kernels).

    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    summary = kernel_summary(prof, steps=1)
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Tuple

# first matching rule wins; patterns are matched against the lower-cased kernel name
CATEGORIES: Tuple[Tuple[str, str], ...] = (
    ("sparse_gemm", r"sparse_gemm|xmma_sparse|sp_mma|cusparselt"),
    ("prune_pack", r"prune|_pack_kernel"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("dense_gemm", r"gemm|nvjet|cutlass|xmma|sm90_|sm80_|wgmma|cublas|^triton_tem_"),
    ("fused", r"^triton_(poi|red|per)_"),  # torch.compile (inductor) kernels: fused elementwise/reductions/norms
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


def _kernel_events(prof) -> List[Tuple[str, float, float]]:
    """(name, start_us, end_us) of every GPU kernel / memcpy / memset the profiler saw."""
    out = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.elapsed_us() > 0:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return out


def _union_us(intervals: Iterable[Tuple[float, float]]) -> float:
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def kernel_summary(prof, steps: int = 1, top: int = 12) -> Dict:
    """Per step: ms of kernel time by category, the span from the first kernel's start to the last one's end, the
    busy time (union of kernel intervals) and the idle time (span - busy: the GPU waiting for the host), kernel
    count, and the `top` kernels by time."""
    ev = _kernel_events(prof)
    if not ev:
        return {"kernels": 0}
    by_cat: Dict[str, float] = {}
    by_name: Dict[str, List[float]] = {}
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
        "by_category_ms": {k: round(v / steps / 1e3, 3) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:120], "category": categorize(n), "ms": round(t / steps / 1e3, 4),
                         "calls": round(c / steps, 1)} for n, (t, c) in tops],
    }
