"""One way to time GPU work: the median of CUDA-event timings after warm-up (used by plan search and `auto`)."""

import torch


def median_cuda_ms(fn, warmup: int = 3, reps: int = 15) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]
