"""Probe (GPU): how far can the host run ahead of the GPU? Behind a long kernel, count the launches
the host queues before a launch blocks (the driver's queue is full), and time the launches of a CUDA
graph of as many kernels.

    python -m scripts.experiments.probes.probe_launch_queue     # from the repository root

A launched training step (the ViT-L step: ~4,300 kernels) can only be as far ahead of the GPU as
that queue holds; a host pause longer than the queued GPU work leaves the GPU idle, and the step is
slow. A graph replay is queued as one launch, however many kernels it holds.
"""

import json
import time

import torch

from scripts.benchmarks.timing import capture_graphs

SLEEP_CYCLES = (
    4_000_000_000  # ~2 s of GPU time at the H100's ~2 GHz: the queue fills long before it ends
)


def launches_before_block(limit: int = 50_000, block_s: float = 1e-3) -> int | None:
    """Tiny kernels queued behind a long one before a launch takes longer than `block_s` (None:
    never blocked)."""
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    try:
        for i in range(limit):
            start = time.perf_counter()
            x.add_(1)
            if time.perf_counter() - start > block_s:
                return i
        return None
    finally:
        torch.cuda.synchronize()


def graph_replay_launch_ms(kernels: int, replays: int = 4) -> list[float]:
    """Host milliseconds of each of `replays` launches of one graph of `kernels` kernels, queued
    behind a long one."""
    x = torch.zeros(1, device="cuda")

    def adds(_):
        for _ in range(kernels):
            x.add_(1)

    (graph,) = capture_graphs(adds, sets=1, warm=1)
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    out = []
    for _ in range(replays):
        start = time.perf_counter()
        graph.replay()
        out.append(round((time.perf_counter() - start) * 1e3, 3))
    torch.cuda.synchronize()
    return out


def main():
    depth = [launches_before_block() for _ in range(3)]
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "launches_queued_before_block": depth,
        "graph_replay_launch_ms": {k: graph_replay_launch_ms(k) for k in (1_000, 4_300)},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
