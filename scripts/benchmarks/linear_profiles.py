"""Where the time of a 2:4 linear layer goes (`scripts/bench_sparse.py --ops kernels host`): device
time per kernel category of one eager forward + backward, and the host's cost per step (wall time at
a negligible GPU load, a cProfile by Python function and a torch.profiler table)."""

import json
import sys

import torch

from scripts.benchmarks.linear_layers import fwd_bwd_step, linear_pair
from scripts.benchmarks.timing import wall_ms


def kernel_breakdown(dtype, tokens, in_f, out_f, x_dtype, steps=5, backends=(None, "cusparselt")):
    """Device time per kernel category of one eager linear fwd+bwd (nn.Linear vs each backend), from
    the profiler: the numbers behind the fwd+bwd bound (fwd, dgrad, wgrad GEMMs, pack, casts, bias
    gradient), and the GPU's idle time between kernels (host-bound eager steps)."""
    from torch.profiler import ProfilerActivity, profile

    from scripts.benchmarks.profiling import kernel_summary

    out = []
    x = torch.randn(tokens, in_f, device="cuda", dtype=x_dtype, requires_grad=True)
    dy = torch.randn(tokens, out_f, device="cuda", dtype=dtype)
    for backend in backends:
        step = fwd_bwd_step(linear_pair(in_f, out_f, backend), x, dy, dtype)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        summ = kernel_summary(prof, steps=steps, top=12)
        out.append(
            {
                "backend": backend or "nn.Linear",
                "tokens": tokens,
                "in_features": in_f,
                "out_features": out_f,
                "dtype": str(dtype).replace("torch.", ""),
                "input_dtype": str(x_dtype).replace("torch.", ""),
                **summ,
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def bench_host(B, dtype):
    """Host cost of one linear fwd+bwd: wall time per step at 256 tokens (GPU work negligible), and
    a profile of one eager step at 32768 tokens (top CPU ops, synchronisations)."""
    dn = str(dtype).replace("torch.", "")
    for backend in (None, "cusparselt", "auto"):
        x = torch.randn(256, 1024, device="cuda", requires_grad=True)
        dy = torch.randn(256, 4096, device="cuda", dtype=dtype)
        step = fwd_bwd_step(linear_pair(1024, 4096, backend), x, dy, dtype)
        us = wall_ms(step, 5, 50) * 1e3
        B.add(
            op="host_per_step",
            backend=backend or "nn.Linear",
            tokens=256,
            in_features=1024,
            out_features=4096,
            dtype=dn,
            ms=us / 1e3,
            dense_ms=None,
            graph=False,
        )
        if backend is not None:  # where the host time goes, by Python function
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(50):
                step()
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print(
                f"=== cProfile, 50 eager fwd+bwd steps at 256 tokens, {backend} "
                f"(tottime)\n{buf.getvalue()}",
                file=sys.stderr,
                flush=True,
            )
    from torch.profiler import ProfilerActivity, profile

    for backend in ("cusparselt", None):
        x = torch.randn(32768, 1024, device="cuda", requires_grad=True)
        dy = torch.randn(32768, 4096, device="cuda", dtype=dtype)
        step = fwd_bwd_step(linear_pair(1024, 4096, backend), x, dy, dtype)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        tab = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60
        )
        print(
            f"=== profile linear fwd+bwd 32768x1024->4096 {backend or 'nn.Linear'} (3 eager "
            f"steps)\n{tab}",
            file=sys.stderr,
            flush=True,
        )
